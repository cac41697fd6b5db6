"""Restarts: exactly-once across them, the update log replayed, uncommitted files dropped."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.federation.federation import Federation
from fedrl.server.federation.session import PushRequest
from fedrl.server.names import DB_FILE, GLOBAL_STATE_FILE, METRICS_FILE
from fedrl.server.storage.model_store import ModelStore
from fedrl.server.storage.update_log import UpdateLog
from tests.support.server_harness import (
    InProcessServer,
    ServerProcess,
    join,
    make_spec,
    pull,
    push,
    seed,
    server_config,
    wait_for_version,
)

SPEC = make_spec([(4,)])
INITIAL = [np.zeros(4, np.float32)]


def session_dir(data_dir: Path) -> Path:
    return data_dir / "sessions" / "default"


def applied_sequences(data_dir: Path) -> list[tuple[str, int, int | None]]:
    with sqlite3.connect(data_dir / DB_FILE) as db:
        return db.execute(
            "SELECT participant_id, sequence, applied_version FROM acks "
            "ORDER BY participant_id, sequence"
        ).fetchall()


def test_repeated_push_after_restart_gets_the_first_answer_and_no_new_version(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "data", buffer_size=1)
    delta = [np.ones(4, np.float32)]
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "alice", SPEC)
        seed(stub, "alice", SPEC, INITIAL)
        first = push(stub, "alice", SPEC, delta, sequence=1, base_version=0)

    with InProcessServer(config) as server:
        stub = server.stub()
        again = push(stub, "alice", SPEC, delta, sequence=1, base_version=0)
        header, tensors, _ = pull(stub)

    assert again.duplicate and again.weight == first.weight
    assert header.version == 1
    np.testing.assert_allclose(tensors[0], 1.0)


def test_acked_updates_in_the_buffer_survive_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # A buffer that never fills and never times out: only the log keeps them.
    with ServerProcess(data, "--buffer-size", "10", "--buffer-timeout-s", "600") as server:
        stub = server.stub()
        for pid in ("alice", "bob"):
            join(stub, pid, SPEC)
        seed(stub, "alice", SPEC, INITIAL)
        push(
            stub,
            "alice",
            SPEC,
            [np.full(4, 1.0, np.float32)],
            sequence=1,
            base_version=0,
            samples=1,
        )
        push(
            stub, "bob", SPEC, [np.full(4, 4.0, np.float32)], sequence=1, base_version=0, samples=3
        )
        server.kill()

        server.options = ["--buffer-size", "2"]
        server.start()
        stub = server.stub()
        duplicate = push(stub, "bob", SPEC, [np.zeros(4, np.float32)], sequence=1, base_version=0)
        header, tensors = pull_version(stub, 1)

    assert duplicate.duplicate
    assert header.version == 1
    np.testing.assert_allclose(tensors[0], (1 * 1.0 + 3 * 4.0) / 4)
    assert applied_sequences(data) == [("alice", 1, 1), ("bob", 1, 1)]


def test_update_logged_but_never_acked_is_acked_and_applied_at_restart(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data", buffer_size=1)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "alice", SPEC)
        seed(stub, "alice", SPEC, INITIAL)
    # What a crash between the log append and the ack row leaves behind.
    with UpdateLog(session_dir(config.data_dir) / "updates") as log:
        log.append(
            session="default",
            participant_id="alice",
            sequence=1,
            base_version=0,
            samples=10,
            env_steps=50,
            episodes=2,
            weight=10.0,
            staleness=0,
            metrics={},
            tensors=[("t0", np.full(4, 2.0, np.float32))],
        )

    with InProcessServer(config) as server:
        stub = server.stub()
        joined = join(stub, "alice", SPEC)
        retry = push(stub, "alice", SPEC, [np.full(4, 2.0, np.float32)], sequence=1, base_version=0)
        header, tensors, _ = pull(stub)

    assert joined.last_update_sequence == 1
    assert retry.duplicate and retry.goal.episodes_done == 2
    assert header.version == 1
    np.testing.assert_allclose(tensors[0], 2.0)


def test_checkpoint_without_a_committed_row_is_replaced_after_restart(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data", buffer_size=1)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "alice", SPEC)
        seed(stub, "alice", SPEC, INITIAL)
    # A crash after writing version 1's file but before committing its row.
    ModelStore(session_dir(config.data_dir) / "checkpoints").write(
        1, [("t0", np.full(4, 99.0, np.float32))]
    )

    with InProcessServer(config) as server:
        stub = server.stub()
        push(stub, "alice", SPEC, [np.ones(4, np.float32)], sequence=1, base_version=0)
        _, tensors = pull_version(stub, 1)

    np.testing.assert_allclose(tensors[0], 1.0)


def test_sigterm_folds_the_buffer_into_a_version_and_writes_global_state(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ServerProcess(data, "--buffer-size", "10", "--buffer-timeout-s", "600") as server:
        stub = server.stub()
        join(stub, "Макар", SPEC)
        seed(stub, "Макар", SPEC, INITIAL)
        push(stub, "Макар", SPEC, [np.ones(4, np.float32)], sequence=1, base_version=0, episodes=3)

        status = server.stop()

    state = json.loads((data / GLOBAL_STATE_FILE).read_text(encoding="utf-8"))
    metrics = [json.loads(line) for line in (data / METRICS_FILE).read_text("utf-8").splitlines()]
    assert status == 0
    assert applied_sequences(data) == [("Макар", 1, 1)]
    session = state["sessions"][0]
    assert session["current_version"] == 1
    assert session["goal"]["episodes_done"] == 3
    assert session["participants"][0]["participant_id"] == "Макар"
    assert [m["version"] for m in metrics] == [0, 1]
    assert metrics[1]["contributors"] == ["Макар"]


def test_best_version_by_reported_evaluation_is_kept_by_retention(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data", buffer_size=1, keep_last=1, keep_every=1000)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "alice", SPEC)
        seed(stub, "alice", SPEC, INITIAL)
        one = [np.ones(4, np.float32)]
        evals = {1: 50.0, 2: 10.0, 3: 20.0}
        for sequence in range(1, 5):
            metrics = pb.UpdateMetrics(base_eval_return=evals.get(sequence - 1, 0.0))
            push(
                stub,
                "alice",
                SPEC,
                one,
                sequence=sequence,
                base_version=sequence - 1,
                metrics=metrics,
            )
            wait_for_version(stub, sequence)
        status = stub.Status(pb.StatusRequest(session="default"))

    session = status.sessions[0]
    kept = sorted(
        int(p.stem[1:]) for p in (session_dir(config.data_dir) / "checkpoints").glob("v*.npz")
    )
    assert (session.best_version, session.best_eval_return) == (1, pytest.approx(50.0))
    assert kept == [0, 1, 4]
    assert session.best_checkpoint.endswith("v00000001.npz")


def test_spec_hash_of_the_session_survives_restart(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data")
    with InProcessServer(config) as server:
        join(server.stub(), "alice", SPEC)

    with InProcessServer(config) as server:
        joined = join(server.stub(), "bob", SPEC)

    assert joined.spec_hash == spec_hash(SPEC)


def pull_version(
    stub: pb_grpc.FederationStub, version: int
) -> tuple[pb.ModelHeader, list[np.ndarray]]:
    """The newest model, once the newest version is at least `version`."""
    wait_for_version(stub, version)
    header, tensors, _ = pull(stub)
    return header, tensors


def test_update_acked_after_a_newer_one_was_applied_is_applied_after_a_crash(
    tmp_path: Path,
) -> None:
    """Acks reach the buffer out of LSN order: recovery must go by ack rows, not by LSN."""
    config = server_config(tmp_path / "data", buffer_size=1)

    async def crash_with_a_late_ack() -> None:
        federation = await Federation.open(config)
        await federation.join("default", "alice", SPEC, spec_hash(SPEC))
        await federation.join("default", "bob", SPEC, spec_hash(SPEC))
        await federation.seed("default", "alice", spec_hash(SPEC), [("t0", INITIAL[0])])
        session = federation.session("default")
        # alice's push is logged first (lower LSN) but is slow to be acknowledged...
        slow = session.update_log.append(
            session="default",
            participant_id="alice",
            sequence=1,
            base_version=0,
            samples=10,
            env_steps=10,
            episodes=1,
            weight=10.0,
            staleness=0,
            metrics={},
            tensors=[("t0", np.full(4, 3.0, np.float32))],
        )
        # ...while bob's, logged after it, becomes version 1.
        bob = PushRequest("default", "bob", 1, 0, 10, 1, 10, spec_hash(SPEC))
        await federation.push(bob, [("t0", np.ones(4, np.float32))])
        while session.aggregator.current_version < 1:
            await asyncio.wait_for(session.changed.wait(), timeout=30)
        await federation.pushes.acknowledge(session, slow, norm=6.0)
        # kill -9 here: alice is acknowledged, her update in no version. A dead
        # process also drops its lock on the log, which closing it stands for.
        session.update_log.close()

    asyncio.run(crash_with_a_late_ack())
    with InProcessServer(config) as server:
        _, tensors = pull_version(server.stub(), 2)

    assert applied_sequences(config.data_dir) == [("alice", 1, 2), ("bob", 1, 1)]
    np.testing.assert_allclose(tensors[0], 1.0 + 3.0)
