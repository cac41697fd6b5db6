"""The single writer of a session's global model: an asyncio task (FedBuff).

Acknowledged updates arrive on a queue and are clipped and summed per
participant as they arrive (fedrl.server.strategy.aggregate.ParticipantSums),
on the aggregator's own thread. After K of them, or when the oldest has
waited the buffer timeout, the strategy's aggregate goes through its server
step onto the newest global. The session's Strategy decides all of it: K,
the timeout, clipping, the reduction, the learning rate and momentum
(server/strategy/). The new version then becomes visible as
federation/versions.py says: files, then its row, and only then does the
in-memory global move and do readers see it, which is what makes a kill -9
at any instant recoverable.

Committing is disk-bound, so it runs as a commit task on a thread of its
own while the aggregator goes on accumulating the next buffer; the next
version is computed on top of the one being committed (the head) and its
commit starts only once the previous one is done. A commit that fails is
retried as it was (same number, tensors, velocity and updates), so the head
stays valid; only at shutdown does it give up, leaving its updates to the log.

Only this task assigns the global tensors and the version number, so the data
path needs no locks; readers take the (version, tensors) pair, which is
replaced, never mutated.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from fedrl.server.federation.versions import Versions
from fedrl.server.storage.update_record import LoggedUpdate
from fedrl.server.strategy.aggregate import ParticipantSums
from fedrl.server.strategy.strategy import Strategy

log = logging.getLogger(__name__)

NamedTensors = list[tuple[str, np.ndarray]]
T = TypeVar("T")


class AlreadySeededError(Exception):
    """Version 0 exists already: the caller should pull it instead."""


@dataclass(frozen=True)
class Snapshot:
    """A global version as readers see it; replaced as a whole, never mutated."""

    version: int
    tensors: tuple[np.ndarray, ...]
    velocity: tuple[np.ndarray, ...] | None = None
    """The strategy's velocity after this version (server momentum), None when it keeps none."""


@dataclass
class _Seed:
    participant_id: str
    tensors: NamedTensors
    done: asyncio.Future[int] = field(repr=False)


class _Stop:
    """Queued by close(): fold the buffer, then end the task."""


@dataclass(frozen=True)
class _Leave:
    """Queued by forget(): a participant left, so an automatic K stops waiting for it."""

    participant_id: str


class Aggregator:
    """Owns one session's global model; see the module docstring for the commit order."""

    def __init__(
        self,
        *,
        session: str,
        strategy: Strategy,
        versions: Versions,
        on_version: Callable[[int], Awaitable[None]],
        set_aside: Callable[[LoggedUpdate, str], Awaitable[None]],
        snapshot: Snapshot | None = None,
    ) -> None:
        self._session = session
        self._strategy = strategy
        self._versions = versions
        self._on_version = on_version
        self._set_aside = set_aside
        self._snapshot = snapshot
        self._head = snapshot
        """The newest computed version: the committed one, or the one being committed."""
        self._queue: asyncio.Queue[LoggedUpdate | _Seed | _Stop | _Leave] = asyncio.Queue()
        self._buffer: list[LoggedUpdate] = []
        self._last_push: dict[str, float] = {}
        """When each participant's newest update reached the buffer (for an automatic K)."""
        self._accumulation: ParticipantSums | None = None
        """The buffer's updates accumulated; None when it must be rebuilt from the buffer."""
        self._buffer_since = 0.0
        self._in_commit: list[LoggedUpdate] = []
        self._committing: asyncio.Task[bool] | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        # The aggregator's own thread: pushes decoding and logging on the
        # shared pool never make a new version wait for a free worker.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fedrl-agg-{session}")
        self._drained = asyncio.Event()

    @property
    def snapshot(self) -> Snapshot | None:
        """The newest committed global, or None before the session is seeded."""
        return self._snapshot

    @property
    def current_version(self) -> int:
        return self._snapshot.version if self._snapshot else -1

    def pushing_participants(self) -> int:
        """Participants whose last update came within the active window: those an automatic K
        waits for (a member that crashed drops out when the window passes, one that leaves at
        once)."""
        horizon = time.monotonic() - self._strategy.rule.active_window_s
        self._last_push = {p: t for p, t in self._last_push.items() if t >= horizon}
        return len(self._last_push)

    @property
    def pending(self) -> int:
        """Acknowledged updates not yet in a committed version."""
        return len(self._buffer) + self._queue.qsize() + len(self._in_commit)

    async def wait_for_room(self, limit: int) -> None:
        """Wait while `limit` or more updates are pending, so pushes slow to the aggregation rate.

        Without this, a burst beyond the aggregation rate would queue without
        bound, in memory and in the update log.
        """
        while self.pending >= limit:
            drained = self._drained
            await drained.wait()

    def note_best(self, version: int) -> None:
        """Tell retention which version has the best evaluation return."""
        self._versions.note_best(version)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"aggregator:{self._session}")
        self._task.add_done_callback(self._report_exit)

    def _report_exit(self, task: asyncio.Task[None]) -> None:
        # A dead aggregator would leave pushes waiting for room forever: say so loudly.
        if not task.cancelled() and task.exception() is not None:
            log.critical(
                "session %r: the aggregator stopped", self._session, exc_info=task.exception()
            )

    def submit(self, update: LoggedUpdate) -> None:
        """Queue an update that is already durable and acknowledged."""
        self._queue.put_nowait(update)

    def forget(self, participant_id: str) -> None:
        """A participant left the session: an automatic K no longer counts it.

        Without this, a member that leaves cleanly would hold each version
        back for the buffer timeout until its last push ages out of the
        active window, and members syncing in rounds would wait that long
        every round.
        """
        self._queue.put_nowait(_Leave(participant_id))

    async def seed(self, participant_id: str, tensors: NamedTensors) -> int:
        """Make version 0; AlreadySeededError if a version exists."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Seed(participant_id, tensors, done))
        return await done

    async def close(self) -> None:
        """Fold what is buffered into a last version, then stop."""
        if self._task is not None and not self._task.done():
            self._queue.put_nowait(_Stop())
            await self._task
        self._worker.shutdown(wait=True)
        self._versions.close()

    async def _in_worker(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, call, *args)

    async def _run(self) -> None:
        while True:
            item = await self._next_item()
            if item is None:
                await self._flush_guarded()
            elif isinstance(item, _Stop):
                self._stopping = True
                # A version whose commit gave up is not a base for another.
                if await self._previous_committed():
                    await self._flush_guarded()
                    await self._previous_committed()
                return
            elif isinstance(item, _Seed):
                await self._seed(item)
            else:
                if isinstance(item, _Leave):
                    self._last_push.pop(item.participant_id, None)
                else:
                    await self._add(item)
                # A new update, or a smaller K once a member left, may fill the buffer.
                target = self._strategy.buffer_target(self.pushing_participants())
                if self._buffer and len(self._buffer) >= target:
                    await self._flush_guarded()

    async def _add(self, update: LoggedUpdate) -> None:
        """Buffer an update and accumulate it now, while the previous version commits."""
        self._last_push[update.participant_id] = time.monotonic()
        if not self._buffer:
            self._buffer_since = time.monotonic()
            self._accumulation = ParticipantSums(self._strategy.aggregate)
        self._buffer.append(update)
        accumulation = self._accumulation
        if accumulation is None:
            return
        try:
            await self._in_worker(self._accumulate, accumulation, [update])
        except Exception:
            # Acknowledged, so never dropped: the flush rebuilds from the buffer
            # and reports the problem there, retrying as for any failed flush.
            log.exception("session %r: accumulating an update failed", self._session)
            self._accumulation = None

    def _accumulate(self, accumulation: ParticipantSums, updates: Sequence[LoggedUpdate]) -> None:
        for update in updates:
            delta = self._strategy.clip([tensor for _, tensor in update.tensors])
            accumulation.add(update.participant_id, delta, update.weight)

    async def _next_item(self) -> LoggedUpdate | _Seed | _Stop | _Leave | None:
        """The next command, or None when the buffer's timeout has come."""
        if not self._buffer:
            return await self._queue.get()
        remaining = self._buffer_since + self._strategy.rule.buffer_timeout_s - time.monotonic()
        if remaining <= 0:
            return None
        try:
            return await asyncio.wait_for(self._queue.get(), remaining)
        except TimeoutError:
            return None

    async def _seed(self, item: _Seed) -> None:
        if self._snapshot is not None:
            item.done.set_exception(
                AlreadySeededError(
                    f"session {self._session!r} already has version {self.current_version}; "
                    "pull it instead of seeding"
                )
            )
            return
        try:
            await self._commit(
                Snapshot(0, tuple(t for _, t in item.tensors)),
                parent=-1,
                updates=[],
                seeded_by=item.participant_id,
            )
        except Exception as exc:
            item.done.set_exception(exc)
        else:
            self._head = self._snapshot
            item.done.set_result(0)

    async def _flush_guarded(self) -> None:
        """Flush; on failure set aside the updates that cannot be applied and flush the rest.

        No participant can stall a session: an update whose aggregate or
        application fails (non-finite, beyond float32) is quarantined on its
        own and the others become the version. A failure no single update
        explains keeps the buffer (it is in the log) for the next trigger.
        """
        try:
            await self._flush()
            return
        except Exception:
            log.exception("session %r: making a new version failed", self._session)
        head = self._head
        try:
            culprits = (
                await self._in_worker(self._unappliable, head, list(self._buffer))
                if head is not None
                else []
            )
            for update, reason in culprits:
                await self._set_aside(update, reason)
                self._buffer.remove(update)
        except Exception:
            log.exception("session %r: setting aside unappliable updates failed", self._session)
            culprits = []
        if culprits:
            self._accumulation = None
            try:
                await self._flush()
                return
            except Exception:
                log.exception("session %r: making a new version failed again", self._session)
        log.error("session %r: the buffer stays for a retry at the next trigger", self._session)
        self._buffer_since = time.monotonic()

    def _unappliable(
        self, head: Snapshot, updates: Sequence[LoggedUpdate]
    ) -> list[tuple[LoggedUpdate, str]]:
        """The updates that break a version, each with why, found by adding them one at a time.

        Each update is tried on top of those already found good; one whose
        addition makes the aggregate or the new global fail is a culprit. Only
        runs after a failed flush, so its K tries of the strategy cost nothing
        in the common case.
        """
        good = ParticipantSums(self._strategy.aggregate)
        culprits: list[tuple[LoggedUpdate, str]] = []
        for update in updates:
            trial = good.copy()
            try:
                self._accumulate(trial, [update])
                self._next(head, trial)
            except Exception as exc:
                culprits.append((update, f"cannot be aggregated: {exc}"))
                continue
            good = trial
        return culprits

    async def _flush(self) -> None:
        head = self._head
        if not self._buffer or head is None:
            return
        updates = list(self._buffer)
        accumulation = self._accumulation
        if accumulation is None:
            accumulation = ParticipantSums(self._strategy.aggregate)
            await self._in_worker(self._accumulate, accumulation, updates)
            self._accumulation = accumulation
        new = await self._in_worker(self._next, head, accumulation)
        # Versions commit in order: the one this is computed on comes first.
        if not await self._previous_committed():
            return
        self._head = new
        self._in_commit = updates
        del self._buffer[: len(updates)]
        self._accumulation = None
        self._committing = asyncio.create_task(
            self._commit_until_done(new, head.version, updates),
            name=f"commit:{self._session}:{new.version}",
        )

    def _next(self, head: Snapshot, accumulation: ParticipantSums) -> Snapshot:
        """The version after `head`: the buffer's aggregate through the strategy's server step."""
        tensors, velocity = self._strategy.step(head.tensors, accumulation.result(), head.velocity)
        return Snapshot(
            head.version + 1, tuple(tensors), None if velocity is None else tuple(velocity)
        )

    async def _previous_committed(self) -> bool:
        """Wait for the commit in flight, if any; False if it gave up (only at shutdown)."""
        if self._committing is None:
            return True
        return await self._committing

    async def _commit_until_done(
        self, version: Snapshot, parent: int, updates: list[LoggedUpdate]
    ) -> bool:
        """Commit a computed version, retrying it unchanged until it succeeds or the server stops.

        A retry must be this exact version: the next one may already be
        computed on top of it. Giving up leaves its updates unapplied in the
        log and the database, and a restart replays them.
        """
        while True:
            try:
                await self._commit(version, parent=parent, updates=updates)
            except Exception:
                log.exception(
                    "session %r: committing version %d failed; will retry",
                    self._session,
                    version.version,
                )
                if self._stopping:
                    return False
                await asyncio.sleep(self._strategy.rule.buffer_timeout_s)
            else:
                return True

    async def _commit(
        self,
        version: Snapshot,
        *,
        parent: int,
        updates: Sequence[LoggedUpdate],
        seeded_by: str | None = None,
    ) -> None:
        row = await self._versions.commit(
            version.version,
            parent=parent,
            tensors=version.tensors,
            velocity=version.velocity,
            updates=updates,
            seeded_by=seeded_by,
        )
        self._snapshot = version
        if updates:
            self._in_commit = []
            drained, self._drained = self._drained, asyncio.Event()
            drained.set()
        await self._versions.keep_house(row, updates)
        await self._on_version(version.version)
