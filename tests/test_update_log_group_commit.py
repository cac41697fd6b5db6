"""UpdateLog group commit: concurrent appends share one fdatasync, and fail together."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fedrl.server.storage.update_log import UpdateLog, UpdateLogError
from fedrl.server.storage.update_record import LoggedUpdate

FOLLOWERS = 7
HOLD_S = 0.5
"""How long the first sync is held so that the other appends queue behind it."""


def append(log: UpdateLog, sequence: int) -> LoggedUpdate:
    delta = np.random.default_rng(sequence).standard_normal(64).astype(np.float32)
    return log.append(
        session="s",
        participant_id="Макар",
        sequence=sequence,
        base_version=0,
        samples=10,
        env_steps=10,
        episodes=1,
        weight=1.0,
        staleness=0,
        metrics={},
        tensors=[("w", delta)],
    )


class HeldFirstSync:
    """os.fdatasync that counts calls and holds the first one until released."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_started = threading.Event()
        self.release = threading.Event()
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.calls == 1:
            self.first_started.set()
            self.release.wait(timeout=30)
        self._real(fd)


def run_behind_a_held_sync(
    log: UpdateLog, sync: HeldFirstSync, before_release: Callable[[], None] = lambda: None
) -> tuple[LoggedUpdate, dict[int, LoggedUpdate | BaseException]]:
    """One append whose sync is held while FOLLOWERS more queue; their outcomes by sequence."""
    outcomes: dict[int, LoggedUpdate | BaseException] = {}

    def push(sequence: int) -> None:
        try:
            outcomes[sequence] = append(log, sequence)
        except Exception as exc:  # the test inspects every outcome
            outcomes[sequence] = exc

    leader = threading.Thread(target=push, args=(1,))
    leader.start()
    assert sync.first_started.wait(timeout=30)
    followers = [threading.Thread(target=push, args=(2 + i,)) for i in range(FOLLOWERS)]
    for thread in followers:
        thread.start()
    threading.Event().wait(HOLD_S)
    before_release()
    sync.release.set()
    for thread in [leader, *followers]:
        thread.join(timeout=30)
    first = outcomes.pop(1)
    assert isinstance(first, LoggedUpdate)
    return first, outcomes


def test_appends_queued_behind_a_sync_share_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync = HeldFirstSync()
    monkeypatch.setattr(os, "fdatasync", sync)

    with UpdateLog(tmp_path) as log:
        first, others = run_behind_a_held_sync(log, sync)
        replayed = list(log.replay(0))

    assert first.lsn == 1
    assert all(isinstance(o, LoggedUpdate) for o in others.values())
    assert sorted(o.lsn for o in others.values() if isinstance(o, LoggedUpdate)) == list(
        range(2, 2 + FOLLOWERS)
    )
    # One sync for the first append; the queued ones need far fewer than one each.
    assert sync.calls < 1 + FOLLOWERS
    assert [r.lsn for r in replayed] == list(range(1, 2 + FOLLOWERS))
    assert {r.lsn: r.sequence for r in replayed} == {
        o.lsn: o.sequence for o in [first, *others.values()] if isinstance(o, LoggedUpdate)
    }


def test_a_group_spanning_segments_rolls_and_keeps_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync = HeldFirstSync()
    monkeypatch.setattr(os, "fdatasync", sync)

    # About two records per segment: the queued group has to roll several times.
    with UpdateLog(tmp_path, segment_bytes=900) as log:
        _, others = run_behind_a_held_sync(log, sync)
        replayed = list(log.replay(0))
    with UpdateLog(tmp_path) as reopened:
        after_restart = [r.lsn for r in reopened.replay(0)]

    assert all(isinstance(o, LoggedUpdate) for o in others.values())
    assert len(list(tmp_path.glob("*.wal"))) > 2
    assert [r.lsn for r in replayed] == list(range(1, 2 + FOLLOWERS))
    assert after_restart == list(range(1, 2 + FOLLOWERS))


def test_a_failed_group_write_fails_every_record_in_it_and_consumes_no_lsn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync = HeldFirstSync()
    monkeypatch.setattr(os, "fdatasync", sync)
    real_pwrite = os.pwrite

    def failing_pwrite(fd: int, data: bytes, offset: int) -> int:
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        raise OSError(28, "No space left on device")

    with UpdateLog(tmp_path) as log:
        first, others = run_behind_a_held_sync(
            log, sync, lambda: monkeypatch.setattr(os, "pwrite", failing_pwrite)
        )
        after = append(log, 100)
        replayed = list(log.replay(0))

    assert first.lsn == 1
    failures = list(others.values())
    assert all(isinstance(f, OSError | UpdateLogError) for f in failures)
    assert any("No space left" in str(f) for f in failures)
    # The failed records took no LSN: the next append follows the last durable one.
    assert after.lsn == 2
    assert [r.sequence for r in replayed] == [1, 100]
