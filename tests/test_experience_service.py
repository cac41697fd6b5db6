"""ExperienceExchange over a real server on 127.0.0.1 port 0: participants, refusals, restarts."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from fedrl.common.chunking import DecodeLimits, chunk_tensors
from fedrl.common.experience import BatchAssembler, ExperienceBatch, batch_messages
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import experience_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.transport.limits import LimitsConfig
from tests.support.experience import (
    CONFIG,
    Server,
    assert_same_batch,
    cartpole_spec,
    make_batch,
)
from tests.support.server_harness import join, metadata


@pytest.fixture
def exchange(experience_server: Server) -> pb_grpc.ExperienceExchangeStub:
    federation, experience = experience_server.stubs()
    for pid in ("alice", "bob", "Макар"):
        join(federation, pid, cartpole_spec())
    return experience


def push(
    stub: pb_grpc.ExperienceExchangeStub,
    pid: str,
    *batches: tuple[int, ExperienceBatch],
) -> pb.PushExperienceReply:
    messages = [
        message
        for sequence, batch in batches
        for message in batch_messages(
            batch, session="default", participant_id=pid, sequence=sequence, chunk_bytes=8 << 10
        )
    ]
    return stub.PushExperience(iter(messages), metadata=metadata(pid), timeout=60)  # type: ignore[no-any-return]


def pull(
    stub: pb_grpc.ExperienceExchangeStub,
    pid: str,
    *,
    cursor: int = 0,
    budget: int = 100_000,
    codec: tpb.Codec = tpb.CODEC_ZSTD,
) -> tuple[list[tuple[pb.ExperienceHeader, ExperienceBatch]], pb.ExperienceEnd]:
    request = pb.PullExperienceRequest(
        session="default", participant_id=pid, cursor=cursor, max_transitions=budget, codec=codec
    )
    received: list[tuple[pb.ExperienceHeader, ExperienceBatch]] = []
    header: pb.ExperienceHeader | None = None
    assembler: BatchAssembler | None = None
    end: pb.ExperienceEnd | None = None
    for message in stub.PullExperience(request, metadata=metadata(pid), timeout=60):
        if message.HasField("header"):
            header = message.header
            assembler = BatchAssembler(header, DecodeLimits())
        elif message.HasField("chunk"):
            assert assembler is not None and header is not None
            assembler.add(message.chunk)
            if assembler.complete:
                received.append((header, assembler.result()))
        else:
            end = message.end
    assert end is not None, "pull stream without its end message"
    return received, end


def _poke(batch: ExperienceBatch, name: str, value: object) -> ExperienceBatch:
    column = getattr(batch, name).copy()
    column[0] = value
    return dataclasses.replace(batch, **{name: column})


def test_a_batch_travels_from_one_participant_to_another(
    exchange: pb_grpc.ExperienceExchangeStub,
) -> None:
    batch = make_batch(3000, n_step=3)

    reply = push(exchange, "alice", (1, batch))
    received, end = pull(exchange, "bob")

    assert [(a.sequence, a.duplicate, a.transitions_stored) for a in reply.acks] == [
        (1, False, 3000)
    ]
    assert len(received) == 1
    header, got = received[0]
    assert (header.participant_id, header.sequence) == ("alice", 1)
    assert_same_batch(got, batch)
    assert (end.next_cursor, end.transitions_sent) == (header.cursor, 3000)


def test_a_participant_never_receives_its_own_batches(
    exchange: pb_grpc.ExperienceExchangeStub,
) -> None:
    push(exchange, "Макар", (1, make_batch(10)), (2, make_batch(10, seed=2)))
    push(exchange, "bob", (1, make_batch(10, seed=3)))

    received, end = pull(exchange, "Макар")

    assert [(h.participant_id, h.sequence) for h, _ in received] == [("bob", 1)]
    assert end.next_cursor == 3


def test_a_repeated_sequence_is_stored_once(exchange: pb_grpc.ExperienceExchangeStub) -> None:
    batch = make_batch(100)
    push(exchange, "alice", (1, batch))

    again = push(exchange, "alice", (1, batch))

    assert [(a.sequence, a.duplicate) for a in again.acks] == [(1, True)]
    assert len(pull(exchange, "bob")[0]) == 1


INVALID = [
    ("action outside the space", lambda b: _poke(b, "action", 7), "action 7 is outside"),
    ("reward beyond the bound", lambda b: _poke(b, "reward", 51.0), "exceeds the bound 50"),
    ("NaN reward", lambda b: _poke(b, "reward", np.nan), "NaN"),
    ("inf observation", lambda b: _poke(b, "obs", np.inf), "NaN or infinite"),
    ("other spec", lambda b: dataclasses.replace(b, env_spec_hash="0" * 64), "env_spec_hash"),
    ("over the batch cap", lambda b: make_batch(5001), "5001 transitions"),
    (
        "obs shape",
        lambda b: dataclasses.replace(b, obs=b.obs[:, :2], next_obs=b.next_obs[:, :2]),
        "obs has shape",
    ),
]


@pytest.mark.parametrize(
    ("change", "reason"), [(c, r) for _, c, r in INVALID], ids=[name for name, _, _ in INVALID]
)
def test_an_invalid_batch_is_refused_with_its_reason_and_nothing_is_stored(
    experience_server: Server, exchange: pb_grpc.ExperienceExchangeStub, change: Any, reason: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        push(exchange, "alice", (1, change(make_batch(20))))

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in refused.value.details()
    received, end = pull(exchange, "bob")
    assert received == [] and end.transitions_sent == 0
    assert _rejected_in_store(experience_server, "alice") == 1


def test_batches_before_an_invalid_one_stay_stored_and_resend_as_duplicates(
    exchange: pb_grpc.ExperienceExchangeStub,
) -> None:
    good, bad = make_batch(10), _poke(make_batch(10, seed=1), "action", 9)
    with pytest.raises(grpc.RpcError):
        push(exchange, "alice", (1, good), (2, bad))

    again = push(exchange, "alice", (1, good))

    assert [(a.sequence, a.duplicate) for a in again.acks] == [(1, True)]
    assert [h.sequence for h, _ in pull(exchange, "bob")[0]] == [1]


def test_pushing_as_someone_else_is_permission_denied(
    exchange: pb_grpc.ExperienceExchangeStub,
) -> None:
    messages = batch_messages(make_batch(5), session="default", participant_id="bob", sequence=1)

    with pytest.raises(grpc.RpcError) as refused:
        exchange.PushExperience(iter(messages), metadata=metadata("alice"), timeout=60)

    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_refused_push_reaches_an_asyncio_client_as_its_status_not_internal(
    experience_server: Server, exchange: pb_grpc.ExperienceExchangeStub
) -> None:
    # Many small chunks keep the client writing after the header was refused:
    # without the server reading the rest first, grpc.aio reported some of
    # these as INTERNAL (grpc/grpc#36066).
    messages = batch_messages(
        make_batch(2_000), session="default", participant_id="bob", sequence=1, chunk_bytes=256
    )
    assert len(messages) > 20

    async def refusals() -> list[grpc.StatusCode]:
        codes = []
        async with grpc.aio.insecure_channel(experience_server.address) as opened:
            stub = pb_grpc.ExperienceExchangeStub(opened)  # type: ignore[no-untyped-call]
            for _ in range(30):
                try:
                    await stub.PushExperience(
                        iter(messages), metadata=metadata("alice"), timeout=60
                    )
                except grpc.aio.AioRpcError as exc:
                    codes.append(exc.code())
        return codes

    codes = asyncio.run(refusals())

    assert codes == [grpc.StatusCode.PERMISSION_DENIED] * 30


def test_a_participant_who_never_joined_may_not_push(
    exchange: pb_grpc.ExperienceExchangeStub,
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        push(exchange, "mallory", (1, make_batch(5)))

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Join first" in refused.value.details()


def test_a_budget_below_one_batch_gets_that_batch_whole_so_no_row_is_skipped(
    exchange: pb_grpc.ExperienceExchangeStub,
) -> None:
    batch = make_batch(500)
    push(exchange, "alice", (1, batch), (2, make_batch(500, seed=2)))

    received, end = pull(exchange, "bob", budget=120)

    assert len(received) == 1
    assert_same_batch(received[0][1], batch)
    assert end.transitions_sent == 500
    rest, _ = pull(exchange, "bob", cursor=end.next_cursor, budget=120)
    assert [h.sequence for h, _ in rest] == [2]


def test_uncompressed_pull_carries_the_same_batch(exchange: pb_grpc.ExperienceExchangeStub) -> None:
    batch = make_batch(200)
    push(exchange, "alice", (1, batch))

    received, _ = pull(exchange, "bob", codec=tpb.CODEC_NONE)

    assert_same_batch(received[0][1], batch)


def test_a_restarted_server_keeps_the_store_and_the_acks(tmp_path: Path) -> None:
    batch = make_batch(300)
    first = Server(tmp_path / "data").start()
    federation, stub = first.stubs()
    join(federation, "alice", cartpole_spec())
    join(federation, "bob", cartpole_spec())
    push(stub, "alice", (1, batch))
    first.stop()

    second = Server(tmp_path / "data").start()
    try:
        _, stub = second.stubs()
        received, _ = pull(stub, "bob")
        again = push(stub, "alice", (1, batch))
    finally:
        second.stop()

    assert_same_batch(received[0][1], batch)
    assert again.acks[0].duplicate


def _rejected_in_store(server: Server, pid: str) -> int:
    """The rejection counter the store keeps in the server's state database."""
    with sqlite3.connect(server.data_dir / "state.sqlite3") as db:
        row = db.execute(
            "SELECT batches_rejected FROM experience_participants WHERE participant_id=?", (pid,)
        ).fetchone()
    return int(row[0]) if row else 0


def _stream_refusal(
    stub: pb_grpc.ExperienceExchangeStub, messages: list[pb.ExperienceChunk]
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        stub.PushExperience(iter(messages), metadata=metadata("alice"), timeout=60)
    return refused.value


def test_malformed_push_streams_are_refused_with_what_was_wrong(
    exchange: pb_grpc.ExperienceExchangeStub,
) -> None:
    messages = batch_messages(
        make_batch(50), session="default", participant_id="alice", sequence=1, chunk_bytes=256
    )
    header, chunks = messages[0], messages[1:]

    cases = {
        "empty stream": [],
        "a chunk before": chunks[:1],
        "ended inside a batch": [header, *chunks[:-1]],
        "ended before its last chunk": [header, chunks[0], header],
        "arrived where chunk": [header, chunks[1]],
    }

    for reason, stream in cases.items():
        refused = _stream_refusal(exchange, stream)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, reason
        assert reason in refused.details(), (reason, refused.details())
    assert pull(exchange, "bob")[0] == []


def test_a_batch_declaring_more_than_the_server_accepts_is_refused_before_its_data(
    experience_server: Server, exchange: pb_grpc.ExperienceExchangeStub
) -> None:
    messages = batch_messages(make_batch(10), session="default", participant_id="alice", sequence=1)
    messages[0].header.column_specs[0].shape[1] = 1 << 40

    refused = _stream_refusal(exchange, messages[:1])

    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than the limit" in refused.details()
    assert _rejected_in_store(experience_server, "alice") == 1


def test_a_push_that_stalls_mid_batch_is_dropped(tmp_path: Path) -> None:
    server = Server(
        tmp_path / "data",
        dataclasses.replace(CONFIG, limits=LimitsConfig(stream_idle_timeout_s=0.3)),
    ).start()
    try:
        federation, stub = server.stubs()
        join(federation, "alice", cartpole_spec())
        messages = batch_messages(
            make_batch(50), session="default", participant_id="alice", sequence=1, chunk_bytes=256
        )

        answered = threading.Event()

        def stalling() -> Iterator[pb.ExperienceChunk]:
            yield from messages[:2]
            # Silent until the server has answered (or the call's own deadline).
            answered.wait(30)
            yield from messages[2:]

        try:
            with pytest.raises(grpc.RpcError) as refused:
                stub.PushExperience(stalling(), metadata=metadata("alice"), timeout=30)
        finally:
            answered.set()
    finally:
        server.stop()

    assert refused.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "idle" in refused.value.details()


def test_a_column_of_the_wrong_dtype_is_refused_over_the_wire(
    exchange: pb_grpc.ExperienceExchangeStub,
) -> None:
    messages = batch_messages(make_batch(20), session="default", participant_id="alice", sequence=1)
    action = next(s for s in messages[0].header.column_specs if s.name == "action")
    action.dtype = tpb.DTYPE_FLOAT32

    refused = _stream_refusal(exchange, messages)

    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'action' is float32" in refused.details()
    assert pull(exchange, "bob")[0] == []


def test_a_batch_in_the_former_per_column_format_is_refused_with_the_reason(
    exchange: pb_grpc.ExperienceExchangeStub,
) -> None:
    batch = make_batch(20)
    # What a client of the former format sent: one tensor per column, no column specs.
    _, chunks = chunk_tensors(batch.columns())
    header = pb.ExperienceHeader(
        session="default",
        participant_id="alice",
        sequence=1,
        env_spec_hash=batch.env_spec_hash,
        transitions=20,
        n_step=1,
        gamma=batch.gamma,
    )
    former = [pb.ExperienceChunk(header=header), *(pb.ExperienceChunk(chunk=c) for c in chunks)]

    refused = _stream_refusal(exchange, former)

    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "column_specs is empty" in refused.details()
    assert pull(exchange, "bob")[0] == []


def limited_server(tmp_path: Path, **limits: Any) -> tuple[Server, pb_grpc.ExperienceExchangeStub]:
    config = dataclasses.replace(CONFIG, limits=LimitsConfig(**limits))
    server = Server(tmp_path / "data", config).start()
    federation, experience = server.stubs()
    for pid in ("alice", "bob"):
        join(federation, pid, cartpole_spec())
    return server, experience


def test_experience_pushes_past_the_rate_limit_are_throttled_per_participant(
    tmp_path: Path,
) -> None:
    server, exchange = limited_server(tmp_path, push_rate_per_s=0.01, push_burst=2)
    try:
        push(exchange, "alice", (1, make_batch(5)))
        push(exchange, "alice", (2, make_batch(5, seed=2)))
        with pytest.raises(grpc.RpcError) as throttled:
            push(exchange, "alice", (3, make_batch(5, seed=3)))
        others = push(exchange, "bob", (1, make_batch(5)))
    finally:
        server.stop()

    assert throttled.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "experience push rate limit" in throttled.value.details()
    assert [ack.sequence for ack in others.acks] == [1]


def test_experience_streams_past_the_limit_are_refused(tmp_path: Path) -> None:
    server, exchange = limited_server(tmp_path, max_streams_per_participant=1)
    release = threading.Event()
    header, *chunks = batch_messages(
        make_batch(5), session="default", participant_id="alice", sequence=1
    )

    def held_open() -> Iterator[pb.ExperienceChunk]:
        yield header
        release.wait(30)
        yield from chunks

    try:
        first = exchange.PushExperience.future(held_open(), metadata=metadata("alice"))
        with pytest.raises(grpc.RpcError) as refused:
            # Pulls count against the same limit; the push above holds the one slot.
            for _ in range(50):
                pull(exchange, "alice")
        release.set()
        assert [ack.sequence for ack in first.result(timeout=30).acks] == [1]
    finally:
        release.set()
        server.stop()

    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "stream limit" in refused.value.details()
