"""Uploads the server answers before their last chunk: the client gets the server's status.

A grpc.aio client whose write fails because the server already ended the
call reports INTERNAL "Internal error from Core" instead of the status the
server sent (grpc/grpc#36066). The server therefore reads the rest of an
upload before answering. Many small chunks keep the client writing after
the header was refused; against the server without the drain, 3 to 7 in 100
such pushes came back INTERNAL, and the first test below failed 4 runs in 4.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
import pytest

from fedrl.client.federation.federation_client import (
    FederationClient,
    RejectedError,
    UnavailableError,
    build_update,
)
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.transport.limits import drain
from tests.support.server_harness import InProcessServer, make_spec, metadata, named, server_config

T = TypeVar("T")
SPEC = make_spec([(64, 64)])
PUSHES = 100
SMALL_CHUNK_BYTES = 256
"""64x64 bfloat16 values in 256-byte chunks: about 32 messages after the header."""


def run_as(
    address: str, body: Callable[[FederationClient], Awaitable[T]], *, seed: bool = True
) -> T:
    """Join as alice on a channel of its own (seeding the session first), then run body."""

    async def main() -> T:
        async with grpc.aio.insecure_channel(address) as channel:
            client = FederationClient(channel, participant_id="alice", session="default")
            await client.join(SPEC)
            if seed:
                await client.seed_model(named(SPEC, [np.zeros((64, 64))]))
            return await body(client)

    return asyncio.run(main())


def many_chunks(client: FederationClient, sequence: int) -> list[pb.UpdateChunk]:
    delta = np.random.default_rng(sequence).normal(size=(64, 64))
    return build_update(
        session=client.session,
        participant_id=client.participant_id,
        sequence=sequence,
        base_version=0,
        env_steps=10,
        episodes=1,
        samples=10,
        metrics=pb.UpdateMetrics(),
        spec_hash=client.spec_hash,
        delta=named(SPEC, [delta]),
        chunk_bytes=SMALL_CHUNK_BYTES,
    )


async def outcome(push: Awaitable[pb.PushReply]) -> str:
    """What a push came to: "ok" or the status code the client saw."""
    try:
        await push
    except (RejectedError, UnavailableError) as exc:
        return str(exc.code)
    return "ok"


def test_pushes_under_another_name_are_all_permission_denied_never_internal(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "server", push_rate_per_s=1000.0, push_burst=1000)

    async def forged_push(client: FederationClient) -> str:
        forged = many_chunks(client, 1)
        forged[0].header.participant_id = "bob"
        return await outcome(client.push_update(forged))

    with InProcessServer(config) as server:
        run_as(server.address, lambda client: asyncio.sleep(0))
        # A new connection each time: that is when the race showed most often.
        results = [run_as(server.address, forged_push, seed=False) for _ in range(PUSHES)]

    assert results == [str(grpc.StatusCode.PERMISSION_DENIED)] * PUSHES


def test_pushes_over_the_rate_limit_are_all_resource_exhausted_never_internal(
    tmp_path: Path,
) -> None:
    # The seed takes the one token; every push after it is over the limit.
    config = server_config(tmp_path / "server", push_rate_per_s=0.001, push_burst=1)

    async def body(client: FederationClient) -> list[str]:
        return [
            await outcome(client.push_update(many_chunks(client, sequence)))
            for sequence in range(1, PUSHES + 1)
        ]

    with InProcessServer(config) as server:
        results = run_as(server.address, body)

    assert results == [str(grpc.StatusCode.RESOURCE_EXHAUSTED)] * PUSHES


def test_a_repeated_push_gets_its_stored_answer_while_the_client_still_sends_chunks(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "server", push_rate_per_s=1000.0, push_burst=1000)

    async def body(client: FederationClient) -> tuple[pb.PushReply, list[pb.PushReply]]:
        messages = many_chunks(client, 1)
        first = await client.push_update(messages)
        return first, [await client.push_update(messages) for _ in range(PUSHES)]

    with InProcessServer(config) as server:
        first, repeats = run_as(server.address, body)

    assert not first.duplicate
    assert all(r.duplicate and r.current_version == first.current_version for r in repeats)


def test_a_refused_upload_whose_sender_stalls_is_answered_after_the_idle_timeout(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "server", stream_idle_timeout_s=0.5)

    async def stalled_after_forged_header(
        client: FederationClient, stop: asyncio.Event
    ) -> AsyncIterator[pb.UpdateChunk]:
        forged = many_chunks(client, 1)[0]
        forged.header.participant_id = "bob"
        yield forged
        await stop.wait()

    async def body(client: FederationClient) -> grpc.StatusCode:
        stop = asyncio.Event()
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
            try:
                await stub.PushUpdate(
                    stalled_after_forged_header(client, stop),
                    metadata=metadata("alice"),
                    timeout=30,
                )
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            finally:
                stop.set()
        pytest.fail("a forged push was accepted")

    with InProcessServer(config) as server:
        code = run_as(server.address, body)

    assert code == grpc.StatusCode.PERMISSION_DENIED


async def endless(sent: list[int], pause_s: float = 0.0) -> AsyncIterator[pb.UpdateChunk]:
    """Chunks of about 100 bytes for as long as someone reads them."""
    while True:
        sent.append(1)
        yield pb.UpdateChunk(chunk=tpb.TensorChunk(index=len(sent), data=bytes(100)))
        await asyncio.sleep(pause_s)


def test_drain_stops_reading_once_past_its_byte_budget() -> None:
    sent: list[int] = []

    asyncio.run(drain(endless(sent), max_bytes=1000, timeout_s=30))

    # About 100 bytes each: the budget is spent within a dozen messages.
    assert 9 <= len(sent) <= 12


def test_drain_gives_up_on_a_stream_that_never_ends_within_its_time() -> None:
    sent: list[int] = []

    asyncio.run(drain(endless(sent, pause_s=0.01), max_bytes=1 << 30, timeout_s=0.2))

    assert sent
