"""AckBatcher: acks queued while a transaction runs are committed together, answers unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fedrl.common.spec import spec_hash
from fedrl.server.storage.db_runner import AckBatcher, DbRunner
from fedrl.server.storage.state_db import AckRow, StateDB
from tests.support.server_harness import make_spec

T = TypeVar("T")
SPEC = make_spec([(2,)])


class CountingRunner(DbRunner):
    """The real database thread, counting the calls made on it."""

    calls = 0

    async def __call__(self, call: Callable[[StateDB], T]) -> T:
        self.calls += 1
        return await super().__call__(call)


def ack(participant: str, sequence: int) -> AckRow:
    return AckRow(
        session="s",
        participant_id=participant,
        sequence=sequence,
        lsn=sequence,
        base_version=0,
        current_version=0,
        staleness=0,
        weight=1.0,
        episodes=2,
        env_steps=10,
        goal_total=0,
        goal_done=0,
        received_ms=1,
    )


def opened(tmp_path: Path) -> CountingRunner:
    db = StateDB(tmp_path / "state.sqlite3")
    db.create_session("s", SPEC, spec_hash(SPEC), 1000, 1)
    for participant in ("alice", "Макар"):
        db.touch_participant("s", participant, "active", 1)
    return CountingRunner(db)


def test_acks_that_arrive_together_share_one_transaction_and_each_gets_its_row(
    tmp_path: Path,
) -> None:
    runner = opened(tmp_path)

    async def main() -> list[AckRow | None]:
        batcher = AckBatcher(runner)
        acks = [ack("alice" if i % 2 else "Макар", i) for i in range(1, 9)]
        return list(await asyncio.gather(*(batcher.record(a) for a in acks)))

    try:
        stored = asyncio.run(main())
        rows = runner.db.last_sequences("s")
    finally:
        runner.close()

    assert runner.calls == 1
    assert [row.sequence if row else None for row in stored] == list(range(1, 9))
    # Each row carries the session's episode total right after it counted, in order.
    assert [row.goal_done if row else None for row in stored] == list(range(2, 18, 2))
    assert rows == {"alice": 7, "Макар": 8}


def test_the_same_ack_twice_in_one_group_is_stored_once(tmp_path: Path) -> None:
    runner = opened(tmp_path)

    async def main() -> list[AckRow | None]:
        batcher = AckBatcher(runner)
        return list(
            await asyncio.gather(batcher.record(ack("alice", 1)), batcher.record(ack("alice", 1)))
        )

    try:
        first, second = asyncio.run(main())
    finally:
        runner.close()

    assert first is not None and first.goal_done == 2
    assert second is None
