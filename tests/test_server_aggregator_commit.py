"""Aggregator commits: versions in order, a failed commit retried unchanged, nothing lost."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedrl.common.spec import spec_hash
from fedrl.server.federation.aggregator import Aggregator
from fedrl.server.federation.versions import Versions
from fedrl.server.storage.db_runner import DbRunner
from fedrl.server.storage.model_store import ModelStore
from fedrl.server.storage.state_db import StateDB
from fedrl.server.storage.update_log import UpdateLog
from fedrl.server.storage.update_record import LoggedUpdate
from fedrl.server.strategy.fedavg import FedAvg
from fedrl.server.strategy.strategy import Rule
from tests.support.server_harness import make_spec

SPEC = make_spec([(4,)])
SESSION = "s"


class FailingStore(ModelStore):
    """The real store, failing the first `failures` writes of `version` as a full disk would."""

    def __init__(self, root: Path, *, version: int, failures: int) -> None:
        super().__init__(root, keep_last=100)
        self.version = version
        self.failures = failures
        self.attempts = 0

    def write(self, version: int, tensors: Sequence[tuple[str, np.ndarray]]) -> Path:
        if version == self.version:
            self.attempts += 1
            if self.attempts <= self.failures:
                raise OSError(28, "No space left on device")
        return super().write(version, tensors)


def logged(log: UpdateLog, participant: str, sequence: int, value: float) -> LoggedUpdate:
    return log.append(
        session=SESSION,
        participant_id=participant,
        sequence=sequence,
        base_version=0,
        samples=10,
        env_steps=10,
        episodes=1,
        weight=1.0,
        staleness=0,
        metrics={},
        tensors=[("t0", np.full(4, value, dtype=np.float32))],
    )


async def run_session(tmp_path: Path, store: ModelStore, values: list[float]) -> list[int]:
    """Seed zeros, submit one update per value (K=2), stop; the committed version numbers."""
    db = StateDB(tmp_path / "state.sqlite3")
    db.create_session(SESSION, SPEC, spec_hash(SPEC), 1000, 1)
    runner = DbRunner(db)
    log = UpdateLog(tmp_path / "updates")
    versions: list[int] = []

    async def on_version(version: int) -> None:
        versions.append(version)

    async def watermark() -> int:
        return 0

    async def set_aside(update: LoggedUpdate, reason: str) -> None:
        raise AssertionError(f"update {update.lsn} set aside: {reason}")

    committer = Versions(
        session=SESSION,
        names=["t0"],
        store=store,
        velocities=ModelStore(tmp_path / "momentum"),
        update_log=log,
        db=runner,
        data_dir=tmp_path,
        metrics_path=tmp_path / "metrics.jsonl",
        discard_watermark=watermark,
    )
    aggregator = Aggregator(
        session=SESSION,
        strategy=FedAvg(Rule(buffer_size=2, buffer_timeout_s=0.05)),
        versions=committer,
        on_version=on_version,
        set_aside=set_aside,
    )
    aggregator.start()
    try:
        await aggregator.seed("seeder", [("t0", np.zeros(4, dtype=np.float32))])
        for sequence, value in enumerate(values, start=1):
            aggregator.submit(logged(log, f"p{sequence}", sequence, value))
        await aggregator.wait_for_room(1)
    finally:
        await aggregator.close()
        log.close()
        runner.close()
    return versions


def test_a_failed_commit_is_retried_as_the_same_version_and_the_next_follows_it(
    tmp_path: Path,
) -> None:
    store = FailingStore(tmp_path / "checkpoints", version=1, failures=2)

    versions = asyncio.run(run_session(tmp_path, store, [1.0, 3.0, 10.0, 20.0]))

    assert store.attempts == 3
    assert versions == [0, 1, 2]
    assert store.load(1)[0][1].tolist() == [2.0] * 4
    # Version 2 was computed on top of version 1 while version 1 was still failing.
    assert store.load(2)[0][1].tolist() == [17.0] * 4
    db = StateDB(tmp_path / "state.sqlite3", read_only=True)
    try:
        latest = db.latest_version(SESSION)
    finally:
        db.close()
    assert latest is not None and latest.version == 2


def test_versions_commit_in_order_when_updates_keep_coming(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "checkpoints", keep_last=100)
    values = [float(v) for v in range(1, 13)]

    versions = asyncio.run(run_session(tmp_path, store, values))

    assert versions == list(range(7))
    # Each version adds the mean of its pair of updates: (1+2)/2 + (3+4)/2 + ...
    expected = np.cumsum([(a + b) / 2 for a, b in zip(values[::2], values[1::2], strict=True)])
    for version, total in enumerate(expected, start=1):
        assert store.load(version)[0][1].tolist() == [total] * 4
