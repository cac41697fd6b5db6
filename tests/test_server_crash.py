"""kill -9 at random moments under a stream of pushes: nothing acked is lost or applied twice.

Every delta is all ones and the seed all zeros. A version sums each
participant's buffered updates (c_p ones) and averages participants by their
summed weights W_p, so it adds sum(W_p * c_p) / sum(W_p) to its parent, which
the acks table (weight and applied version of every update) lets the test
compute exactly. A version built on a stale global, an update applied twice or
skipped would break that, as would a gap in the version numbers.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.names import DB_FILE
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.server_harness import ServerProcess, channel, join, make_spec, push, seed

SPEC = make_spec([(100, 1000)])
PARTICIPANTS = ("alice", "Макар", "小明")
KILLS = 5


class Pusher(threading.Thread):
    """A participant that pushes as fast as it can and retries a sequence until it is acked."""

    def __init__(self, participant_id: str, address: str) -> None:
        super().__init__(daemon=True)
        self.participant_id = participant_id
        self.address = address
        self.acked: set[int] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        ones = [np.ones((100, 1000), np.float32)]
        with channel(self.address) as opened:
            stub = pb_grpc.FederationStub(opened)  # type: ignore[no-untyped-call]
            sequence, base = 1, 0
            while not self.stop.is_set():
                try:
                    reply = push(
                        stub, self.participant_id, SPEC, ones, sequence=sequence, base_version=base
                    )
                except grpc.RpcError:
                    time.sleep(0.05)  # server down: the same sequence goes again
                    continue
                self.acked.add(sequence)
                sequence, base = sequence + 1, reply.current_version


def _expected_values(applied: list[tuple[int, str, float]], newest: int) -> list[float]:
    """The value every element of each version 0..newest must hold."""
    per_version: dict[int, dict[str, tuple[float, int]]] = {}
    for version, participant, weight in applied:
        weight_sum, count = per_version.setdefault(version, {}).get(participant, (0.0, 0))
        per_version[version][participant] = (weight_sum + weight, count + 1)
    values = [0.0]
    for version in range(1, newest + 1):
        groups = per_version.get(version, {}).values()
        total = sum(w for w, _ in groups)
        step = sum(w * c for w, c in groups) / total if total else 0.0
        values.append(values[-1] + step)
    return values


def check_versions(data_dir: Path, *, running: bool) -> int:
    """Versions 0..N without gaps; every retained checkpoint loads and holds its expected value.

    While the server runs, a file above the newest committed row may be a
    version in the middle of its commit, and a listed file may be pruned
    before it is read; once it has stopped, neither may happen.
    """
    checkpoints = sorted((data_dir / "sessions" / "default" / "checkpoints").glob("v*.npz"))
    with sqlite3.connect(f"{(data_dir / DB_FILE).resolve().as_uri()}?mode=ro", uri=True) as db:
        versions = [v for (v,) in db.execute("SELECT version FROM versions ORDER BY version")]
        applied = db.execute(
            "SELECT applied_version, participant_id, weight FROM acks"
            " WHERE applied_version IS NOT NULL"
        ).fetchall()
    assert versions == list(range(len(versions)))
    expected = _expected_values(applied, versions[-1])
    loaded = 0
    for path in checkpoints:
        version = int(path.stem[1:])
        if version > versions[-1]:
            assert running, f"{path.name} has no committed row"
            continue
        try:
            with np.load(path) as archive:
                values = archive["t0"]
        except FileNotFoundError:
            assert running, f"{path.name} vanished"
            continue
        np.testing.assert_allclose(values, np.full((100, 1000), expected[version]), rtol=1e-5)
        loaded += 1
    assert loaded > 0
    return int(versions[-1])


def ledger(data_dir: Path) -> dict[tuple[str, int], int | None]:
    with sqlite3.connect(f"{(data_dir / DB_FILE).resolve().as_uri()}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT participant_id, sequence, applied_version FROM acks").fetchall()
    return {(pid, seq): applied for pid, seq, applied in rows}


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_doubles_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = random.Random(7)
    options = [
        "--buffer-size",
        "3",
        "--buffer-timeout-s",
        "0.2",
        "--keep-last",
        "3",
        "--keep-every",
        "4",
        "--max-staleness",
        "1000",
    ]
    server = ServerProcess(data, *options, port=free_port()).start()
    stub = server.stub()
    for pid in PARTICIPANTS:
        join(stub, pid, SPEC)
    seed(stub, "alice", SPEC, [np.zeros((100, 1000), np.float32)])
    pushers = [Pusher(pid, server.address) for pid in PARTICIPANTS]
    for pusher in pushers:
        pusher.start()
    try:
        newest = 0
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 1.5))  # a random moment to kill at: the test itself
            server.kill()
            server.start()
            reached = check_versions(data, running=True)
            assert reached >= newest, "a committed version disappeared"
            newest = reached
        before = [len(pusher.acked) for pusher in pushers]
        wait_until(
            lambda: all(len(p.acked) > n for p, n in zip(pushers, before, strict=True)),
            120,
            "every participant to get through to the last server",
        )
    finally:
        for pusher in pushers:
            pusher.stop.set()
        for pusher in pushers:
            pusher.join(timeout=60)
    acked = {(p.participant_id, seq) for p in pushers for seq in p.acked}
    # Let the last buffer time out into a version, then stop gracefully.
    wait_until(
        lambda: all(ledger(data).get(key) is not None for key in acked),
        120,
        "every acknowledged update in a version",
    )
    assert server.stop() == 0

    applied = ledger(data)
    final = check_versions(data, running=False)
    assert len(acked) > 3 * len(PARTICIPANTS)
    assert set(applied) == acked
    assert all(version is not None and 1 <= version <= final for version in applied.values())
