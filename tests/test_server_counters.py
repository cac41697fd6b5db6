"""Participant counters are exact: duplicates under concurrency, and cancels are no rejections."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.federation.federation import Federation
from fedrl.server.status.read_model import StatusView
from fedrl.server.storage.state_db import StateDB
from tests.support.server_harness import (
    InProcessServer,
    join,
    make_spec,
    metadata,
    push,
    seed,
    server_config,
    update_messages,
)
from tests.test_server_session import ones, request, run

BIG = make_spec([(256, 256)])
SPEC = make_spec([(4,)])


def _participant(data_dir: Path, pid: str) -> pb.ParticipantState:
    db = StateDB(data_dir / "state.sqlite3", read_only=True)
    try:
        (state,) = StatusView(db).read("default", 1, 0).sessions
    finally:
        db.close()
    return next(p for p in state.participants if p.participant_id == pid)


def test_a_concurrent_copy_of_a_push_is_counted_as_a_duplicate(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> tuple[bool, bool]:
        first, second = await asyncio.gather(
            federation.push(request(1), ones()), federation.push(request(1), ones())
        )
        return first.duplicate, second.duplicate

    assert sorted(run(tmp_path, scenario)) == [False, True]
    alice = _participant(tmp_path / "data", "alice")
    assert (alice.updates_accepted, alice.updates_duplicate) == (1, 1)


def test_a_push_the_client_cancels_midway_is_not_counted_as_rejected(tmp_path: Path) -> None:
    data_dir = tmp_path / "server"
    server = InProcessServer(server_config(data_dir, chunk_bytes=64 << 10)).start()
    try:
        stub = server.stub()
        join(stub, "alice", BIG)
        seed(stub, "alice", BIG, [np.zeros((256, 256))])
        header, *chunks = update_messages(
            "alice",
            BIG,
            [np.random.default_rng(0).normal(size=(256, 256))],
            sequence=1,
            base_version=0,
            chunk_bytes=64 << 10,
        )
        assert len(chunks) > 1
        first_sent = threading.Event()
        never = threading.Event()

        def cut_short() -> Iterator[pb.UpdateChunk]:
            yield header
            yield chunks[0]
            first_sent.set()
            never.wait(30)

        call = stub.PushUpdate.future(cut_short(), metadata=metadata("alice"))
        first_sent.wait(30)
        call.cancel()
        never.set()
        push(stub, "alice", BIG, [np.zeros((256, 256))], sequence=2, base_version=0)
    finally:
        server.stop()
    alice = _participant(data_dir, "alice")
    assert (alice.updates_accepted, alice.updates_rejected) == (1, 0)


def test_totals_saturate_at_the_largest_integer_and_the_session_keeps_serving(
    tmp_path: Path,
) -> None:
    largest = (1 << 63) - 1
    config = server_config(tmp_path / "server", buffer_size=1)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "alice", SPEC)
        seed(stub, "alice", SPEC, [np.zeros(4, np.float32)])
        for sequence in (1, 2):
            push(
                stub,
                "alice",
                SPEC,
                [np.zeros(4, np.float32)],
                sequence=sequence,
                base_version=0,
                episodes=1 << 62,
                env_steps=largest,
            )
    with InProcessServer(config) as server:
        stub = server.stub()
        notice = stub.GetVersion(pb.GetVersionRequest(), metadata=metadata("alice"))
        joined = join(stub, "alice", SPEC)
        status = stub.Status(pb.StatusRequest())

    (session,) = status.sessions
    assert notice.goal.episodes_done == largest and notice.goal.reached
    assert joined.goal.episodes_done == largest
    assert (session.env_steps, session.participants[0].env_steps) == (largest, largest)
    assert session.participants[0].episodes == largest
