"""The state database off the event loop: one thread for every call, ack rows committed in groups.

SQLite is used from one dedicated thread (DbRunner), so calls never
interleave inside a transaction and the event loop never waits on an fsync.
Ack rows of concurrent pushes share a transaction (AckBatcher), as their log
records share an fdatasync (the update log): under load a push waits for one
disk flush of each kind, not for every other push's.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from fedrl.server.storage.state_db import AckRow, StateDB

T = TypeVar("T")


class DbRunner:
    """Runs StateDB calls on one dedicated thread, so the event loop never blocks on fsync."""

    def __init__(self, db: StateDB) -> None:
        self.db = db
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedrl-db")

    async def __call__(self, call: Callable[[StateDB], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, call, self.db)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.db.close()


class AckBatcher:
    """Group commit of ack rows: acks that arrive while a transaction runs share the next one.

    Each ack row is committed with synchronous=FULL before its push is
    answered; one transaction per push made concurrent pushes queue for
    one fsync each on the database thread. Here a caller waits only for
    the transaction that holds its row, and rows queued meanwhile go into
    the next transaction together.
    """

    def __init__(self, runner: DbRunner) -> None:
        self._runner = runner
        self._queued: list[tuple[AckRow, asyncio.Future[AckRow | None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(self, ack: AckRow) -> AckRow | None:
        """StateDB.record_acks for this ack, committed together with the acks queued beside it."""
        done: asyncio.Future[AckRow | None] = asyncio.get_running_loop().create_future()
        self._queued.append((ack, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued(), name="fedrl-ack-writer")
        return await done

    async def _write_queued(self) -> None:
        while self._queued:
            group, self._queued = self._queued, []
            record = functools.partial(StateDB.record_acks, acks=[ack for ack, _ in group])
            try:
                stored = await self._runner(record)
            except Exception as exc:
                # Every push in the group fails and is retried by its client,
                # as a lone push whose transaction failed always was.
                for _, done in group:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (_, done), row in zip(group, stored, strict=True):
                # A caller cancelled meanwhile (server shutdown) no longer waits.
                if not done.done():
                    done.set_result(row)
