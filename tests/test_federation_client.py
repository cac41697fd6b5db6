"""FederationClient against a real server on 127.0.0.1 port 0: calls, codecs, error mapping."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
import pytest

from fedrl.client.federation.errors import (
    AlreadySeededError,
    RejectedError,
    SpecMismatchError,
    UnavailableError,
)
from fedrl.client.federation.federation_client import (
    FederationClient,
    GlobalModel,
    Timeouts,
    build_update,
)
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from tests.support.ports import free_port
from tests.support.server_harness import InProcessServer, make_spec, named, server_config

T = TypeVar("T")
SPEC = make_spec([(3, 4), (4,)])


@pytest.fixture
def server(start_server: Callable[..., InProcessServer]) -> InProcessServer:
    # buffer_size=1: every accepted update becomes a version at once.
    return start_server(buffer_size=1)


def run_as(
    address: str,
    participant_id: str,
    body: Callable[[FederationClient], Awaitable[T]],
    *,
    session: str = "default",
) -> T:
    """Run body with a client of its own channel and event loop, as a participant would."""

    async def main() -> T:
        async with grpc.aio.insecure_channel(address) as channel:
            client = FederationClient(channel, participant_id=participant_id, session=session)
            return await body(client)

    return asyncio.run(main())


def weights(seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return named(SPEC, [rng.normal(size=(3, 4)), rng.normal(size=4)])


def update(
    client: FederationClient,
    sequence: int,
    delta: list[tuple[str, np.ndarray]],
    *,
    base_version: int = 0,
    dtype: int = tpb.DTYPE_BFLOAT16,
) -> list[pb.UpdateChunk]:
    return build_update(
        session=client.session,
        participant_id=client.participant_id,
        sequence=sequence,
        base_version=base_version,
        env_steps=200,
        episodes=2,
        samples=200,
        metrics=pb.UpdateMetrics(mean_return=21.0),
        spec_hash=client.spec_hash,
        delta=delta,
        dtype=dtype,
        chunk_bytes=client.chunk_bytes,
    )


def test_join_seed_and_pull_round_trip_a_unicode_participant(server: InProcessServer) -> None:
    initial = weights(0)

    async def body(client: FederationClient) -> tuple[pb.JoinReply, int, GlobalModel]:
        joined = await client.join(SPEC)
        version = await client.seed_model(initial)
        return joined, version, await client.pull_model()

    joined, version, model = run_as(server.address, "Макар", body)

    assert joined.current_version == -1
    assert joined.config.chunk_bytes > 0
    assert version == 0
    assert model.version == 0
    for (name, got), (want_name, want) in zip(model.tensors, initial, strict=True):
        assert name == want_name
        np.testing.assert_array_equal(got, want)


def test_pushed_bfloat16_delta_reaches_the_global_model(server: InProcessServer) -> None:
    initial, delta = weights(0), weights(1)

    async def body(client: FederationClient) -> tuple[pb.PushReply, GlobalModel]:
        await client.join(SPEC)
        await client.seed_model(initial)
        reply = await client.push_update(update(client, 1, delta))
        await wait_for_version(server.address, 1)
        return reply, await client.pull_model()

    reply, model = run_as(server.address, "alice", body)

    assert reply.sequence == 1 and not reply.duplicate
    assert reply.goal.episodes_done == 2
    assert model.version == 1
    for (_, got), (_, base), (_, change) in zip(model.tensors, initial, delta, strict=True):
        # bfloat16 keeps 8 bits of mantissa: a relative error below 2^-8.
        np.testing.assert_allclose(got, base + change, rtol=0, atol=np.abs(change).max() / 128)


def test_repeated_push_is_answered_as_duplicate_and_counted_once(server: InProcessServer) -> None:
    async def body(client: FederationClient) -> tuple[pb.PushReply, pb.PushReply, pb.StatusReply]:
        await client.join(SPEC)
        await client.seed_model(weights(0))
        messages = update(client, 1, weights(1))
        first = await client.push_update(messages)
        again = await client.push_update(messages)
        return first, again, await client.status()

    first, again, status = run_as(server.address, "alice", body)

    assert not first.duplicate
    assert again.duplicate and again.sequence == 1
    (participant,) = status.sessions[0].participants
    assert participant.updates_accepted == 1
    assert participant.updates_duplicate == 1
    assert participant.episodes == 2


def test_pull_with_a_held_version_adds_the_servers_delta(server: InProcessServer) -> None:
    async def body(client: FederationClient) -> tuple[GlobalModel, GlobalModel]:
        await client.join(SPEC)
        await client.seed_model(weights(0))
        held = await client.pull_model()
        await client.push_update(update(client, 1, weights(1), dtype=tpb.DTYPE_FLOAT32))
        await wait_for_version(server.address, 1)
        return await client.pull_model(have=held), await client.pull_model()

    via_delta, full = run_as(server.address, "alice", body)

    assert via_delta.version == full.version == 1
    for (_, a), (_, b) in zip(via_delta.tensors, full.tensors, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_join_with_another_model_is_a_spec_mismatch_naming_the_field(
    server: InProcessServer,
) -> None:
    run_as(server.address, "alice", lambda client: client.join(SPEC))
    other = make_spec([(3, 5), (5,)])

    with pytest.raises(SpecMismatchError, match=r"tensors\[0\]\.shape") as caught:
        run_as(server.address, "bob", lambda client: client.join(other))

    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_second_seed_is_already_seeded(server: InProcessServer) -> None:
    async def seed(client: FederationClient) -> int:
        await client.join(SPEC)
        return await client.seed_model(weights(0))

    run_as(server.address, "alice", seed)

    with pytest.raises(AlreadySeededError):
        run_as(server.address, "bob", seed)


def test_update_under_another_participants_name_is_rejected(server: InProcessServer) -> None:
    async def body(client: FederationClient) -> pb.PushReply:
        await client.join(SPEC)
        await client.seed_model(weights(0))
        forged = update(client, 1, weights(1))
        forged[0].header.participant_id = "bob"
        return await client.push_update(forged)

    with pytest.raises(RejectedError) as caught:
        run_as(server.address, "alice", body)

    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_goal_can_be_raised_but_not_lowered(server: InProcessServer) -> None:
    async def body(client: FederationClient) -> tuple[pb.GoalState, pb.VersionNotice]:
        await client.join(SPEC)
        raised = await client.raise_goal(5000)
        return raised, await client.get_version()

    raised, notice = run_as(server.address, "alice", body)

    assert raised.total_episodes == 5000
    assert notice.goal.total_episodes == 5000
    with pytest.raises(RejectedError, match="only be raised"):
        run_as(server.address, "alice", lambda client: client.raise_goal(10))


def test_leave_marks_the_participant_as_left(server: InProcessServer) -> None:
    async def body(client: FederationClient) -> pb.StatusReply:
        await client.join(SPEC)
        await client.leave("done")
        return await client.status()

    status = run_as(server.address, "alice", body)

    assert status.sessions[0].participants[0].status == "left"


def test_unreachable_server_is_unavailable() -> None:
    address = f"127.0.0.1:{free_port()}"

    async def body() -> pb.JoinReply:
        async with grpc.aio.insecure_channel(address) as channel:
            client = FederationClient(
                channel, participant_id="alice", session="default", timeouts=Timeouts(unary_s=2.0)
            )
            return await client.join(SPEC)

    with pytest.raises(UnavailableError):
        asyncio.run(body())


async def wait_for_version(address: str, version: int) -> None:
    """The aggregator publishes a version shortly after the ack; wait for its notice."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
        request = pb.GetVersionRequest(session="default")
        async for notice in stub.WatchVersions(request, timeout=10):
            if notice.current_version >= version:
                return
    raise AssertionError(f"version {version} did not appear")


def test_model_over_the_size_limit_is_rejected_not_retried(tmp_path: Path) -> None:
    # 32 bytes cannot hold the 16-float (64-byte) spec: a permanent refusal.
    config = server_config(tmp_path / "server", max_model_bytes=32)
    with InProcessServer(config) as small, pytest.raises(RejectedError) as caught:
        run_as(small.address, "alice", lambda client: client.join(SPEC))

    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not isinstance(caught.value, UnavailableError)


def test_push_over_the_rate_limit_is_unavailable_for_now(tmp_path: Path) -> None:
    config = server_config(tmp_path / "server", buffer_size=1, push_rate_per_s=0.01, push_burst=1)

    async def body(client: FederationClient) -> None:
        await client.join(SPEC)
        await client.seed_model(weights(0))
        await client.push_update(update(client, 1, weights(1)))
        await client.push_update(update(client, 2, weights(2)))

    with InProcessServer(config) as throttled, pytest.raises(UnavailableError) as caught:
        run_as(throttled.address, "alice", body)

    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit" in str(caught.value)
