"""The single writer of a session's global model: an asyncio task (FedBuff).

Acknowledged updates arrive on a queue and are clipped and summed per
participant as they arrive (fedrl.server.strategy.aggregate.ParticipantSums), on
the aggregator's own thread. After K of them, or when the oldest has waited `buffer_timeout_s`,
the strategy's aggregate is applied to the newest global with the server
learning rate. The new version then becomes visible in this order, which is
what makes a kill -9 at any instant recoverable:

1. the checkpoint file is written, fsynced and renamed (ModelStore.write);
2. the version row and the acks it folds in are committed in one transaction;
3. only then does the in-memory global move and do readers see it;
4. the update log is trimmed below every update not yet in a version.

Those steps are disk-bound, so they run as a commit task on a thread of
their own while the aggregator goes on accumulating the next buffer; the
next version is computed on top of the one being committed (the head) and
its commit starts only once the previous one is done. A commit that fails is
retried as it was (same number, tensors and updates), so the head stays
valid; only at shutdown does it give up, leaving its updates to the log.

Only this task assigns the global tensors and the version number, so the data
path needs no locks; readers take the (version, tensors) pair, which is
replaced, never mutated.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fedrl.server.storage.db_runner import DbRunner
from fedrl.server.storage.model_store import ModelStore
from fedrl.server.storage.state_db import VersionRow
from fedrl.server.storage.update_log import UpdateLog
from fedrl.server.storage.update_record import LoggedUpdate
from fedrl.server.strategy.aggregate import ParticipantSums, Strategy, apply_update, clip_by_norm

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


@dataclass(frozen=True)
class AggregatorSettings:
    """The aggregation knobs of ServerConfig that this task needs."""

    buffer_size: int
    """Updates (K) that trigger a new version; 0: one per recently pushing participant."""
    active_window_s: float
    """With buffer_size 0: how recent a participant's last push must be for it to count."""
    buffer_timeout_s: float
    """Longest wait of a buffered update before a version is made anyway."""
    server_lr: float
    """global += server_lr * aggregate."""
    clip_norm: float
    """Per-update L2 clip; 0 disables it."""


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
        names: Sequence[str],
        store: ModelStore,
        update_log: UpdateLog,
        db: DbRunner,
        strategy: Strategy,
        settings: AggregatorSettings,
        data_dir: Path,
        metrics_path: Path,
        on_version: Callable[[int], Awaitable[None]],
        discard_watermark: Callable[[], Awaitable[int]],
        set_aside: Callable[[LoggedUpdate, str], Awaitable[None]],
        snapshot: Snapshot | None = None,
        best_version: int = -1,
        on_metrics: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._session = session
        self._names = list(names)
        self._store = store
        self._log = update_log
        self._db = db
        self._strategy = strategy
        self._settings = settings
        self._data_dir = data_dir
        self._metrics_path = metrics_path
        self._on_metrics = on_metrics
        """Also given each version's metrics line (e.g. for TensorBoard), on the commit thread."""
        self._on_version = on_version
        self._discard_watermark = discard_watermark
        self._set_aside = set_aside
        self._snapshot = snapshot
        self._head = snapshot
        """The newest computed version: the committed one, or the one being committed."""
        self._best_version = best_version
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
        # The aggregator's own threads: pushes decoding and logging on the
        # shared pool never make a new version wait for a free worker, and
        # a commit's fsyncs never hold up accumulating the next buffer.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fedrl-agg-{session}")
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fedrl-commit-{session}")
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
        horizon = time.monotonic() - self._settings.active_window_s
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
        self._best_version = version

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
        self._io.shutdown(wait=True)

    async def _in_worker(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, call, *args)

    async def _in_io(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, call, *args)

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
                if self._buffer and len(self._buffer) >= self._buffer_target():
                    await self._flush_guarded()

    def _buffer_target(self) -> int:
        """K: the configured one, or the number of participants who pushed lately (at least 1).

        An automatic K follows the group: alone, every update is a version at
        once, so the global model trails the participant by one update rather
        than by K of them; in a group of N, a version waits for about one
        update from each member, so it averages everyone's progress instead of
        adding up N learners' steps, which made the global Q-network diverge
        (bench/federation.py). The buffer timeout still bounds the wait.
        """
        if self._settings.buffer_size:
            return self._settings.buffer_size
        return max(1, self.pushing_participants())

    async def _add(self, update: LoggedUpdate) -> None:
        """Buffer an update and accumulate it now, while the previous version commits."""
        self._last_push[update.participant_id] = time.monotonic()
        if not self._buffer:
            self._buffer_since = time.monotonic()
            self._accumulation = ParticipantSums(self._strategy)
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
            delta = [tensor for _, tensor in update.tensors]
            if self._settings.clip_norm > 0:
                delta, _norm = clip_by_norm(delta, self._settings.clip_norm)
            accumulation.add(update.participant_id, delta, update.weight)

    async def _next_item(self) -> LoggedUpdate | _Seed | _Stop | _Leave | None:
        """The next command, or None when the buffer's timeout has come."""
        if not self._buffer:
            return await self._queue.get()
        remaining = self._buffer_since + self._settings.buffer_timeout_s - time.monotonic()
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
                0,
                parent=-1,
                tensors=[t for _, t in item.tensors],
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
                await self._in_worker(self._unappliable, head.tensors, list(self._buffer))
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
        self, global_tensors: Sequence[np.ndarray], updates: Sequence[LoggedUpdate]
    ) -> list[tuple[LoggedUpdate, str]]:
        """The updates that break a version, each with why, found by adding them one at a time.

        Each update is tried on top of those already found good; one whose
        addition makes the aggregate or the new global fail is a culprit. Only
        runs after a failed flush, so its K tries of the strategy cost nothing
        in the common case.
        """
        good = ParticipantSums(self._strategy)
        culprits: list[tuple[LoggedUpdate, str]] = []
        for update in updates:
            trial = good.copy()
            try:
                self._accumulate(trial, [update])
                self._new_global(global_tensors, trial)
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
            accumulation = ParticipantSums(self._strategy)
            await self._in_worker(self._accumulate, accumulation, updates)
            self._accumulation = accumulation
        new_tensors = await self._in_worker(self._new_global, head.tensors, accumulation)
        # Versions commit in order: the one this is computed on comes first.
        if not await self._previous_committed():
            return
        self._head = Snapshot(head.version + 1, tuple(new_tensors))
        self._in_commit = updates
        del self._buffer[: len(updates)]
        self._accumulation = None
        self._committing = asyncio.create_task(
            self._commit_until_done(head.version + 1, head.version, new_tensors, updates),
            name=f"commit:{self._session}:{head.version + 1}",
        )

    def _new_global(
        self, global_tensors: Sequence[np.ndarray], accumulation: ParticipantSums
    ) -> list[np.ndarray]:
        aggregate = accumulation.result()
        return apply_update(list(global_tensors), aggregate, server_lr=self._settings.server_lr)

    async def _previous_committed(self) -> bool:
        """Wait for the commit in flight, if any; False if it gave up (only at shutdown)."""
        if self._committing is None:
            return True
        return await self._committing

    async def _commit_until_done(
        self, version: int, parent: int, tensors: list[np.ndarray], updates: list[LoggedUpdate]
    ) -> bool:
        """Commit a computed version, retrying it unchanged until it succeeds or the server stops.

        A retry must be this exact version: the next one may already be
        computed on top of it. Giving up leaves its updates unapplied in the
        log and the database, and a restart replays them.
        """
        while True:
            try:
                await self._commit(version, parent=parent, tensors=tensors, updates=updates)
            except Exception:
                log.exception(
                    "session %r: committing version %d failed; will retry", self._session, version
                )
                if self._stopping:
                    return False
                await asyncio.sleep(self._settings.buffer_timeout_s)
            else:
                return True

    async def _commit(
        self,
        version: int,
        *,
        parent: int,
        tensors: Sequence[np.ndarray],
        updates: Sequence[LoggedUpdate],
        seeded_by: str | None = None,
    ) -> None:
        named = list(zip(self._names, tensors, strict=True))
        path = await self._in_io(self._store.write, version, named)
        lsn = max((u.lsn for u in updates), default=self._log.last_lsn)
        returns = [u.metrics["mean_return"] for u in updates if "mean_return" in u.metrics]
        row = VersionRow(
            session=self._session,
            version=version,
            parent=parent,
            created_ms=int(time.time() * 1000),
            lsn=lsn,
            contributors=(seeded_by,)
            if seeded_by
            else tuple(dict.fromkeys(u.participant_id for u in updates)),
            max_staleness=max((u.staleness for u in updates), default=0),
            mean_return=float(np.mean(returns)) if returns else None,
            checkpoint=_relative(path, self._data_dir),
        )
        applied = [(u.participant_id, u.sequence) for u in updates]
        try:
            await self._db(lambda db: db.commit_version(row, applied))
        except BaseException:
            # Never committed, so never visible; the retry may fold a different
            # buffer into this version number, and checkpoints are immutable.
            await self._in_io(functools.partial(path.unlink, missing_ok=True))
            raise
        self._snapshot = Snapshot(version, tuple(tensors))
        if updates:
            self._in_commit = []
            drained, self._drained = self._drained, asyncio.Event()
            drained.set()
        try:
            watermark = await self._discard_watermark()
            pruned = await self._in_io(self._after_commit, row, updates, watermark)
            if pruned:
                # A crash before this leaves a checkpoint name whose file is
                # gone: Status shows it, PullModel answers NOT_FOUND. Harmless.
                await self._db(lambda db: db.mark_pruned(self._session, pruned))
        except Exception:
            # The version is committed; housekeeping is retried after the next one.
            log.exception(
                "session %r: housekeeping after version %d failed", self._session, version
            )
        await self._on_version(version)

    def _after_commit(
        self, row: VersionRow, updates: Sequence[LoggedUpdate], watermark: int
    ) -> list[int]:
        """Housekeeping after the commit; each step is redone or harmless after a crash."""
        self._append_metrics(row, updates)
        self._log.discard_through(watermark)
        best = self._best_version if self._best_version >= 0 else None
        return self._store.retain(current=row.version, best=best)

    def _append_metrics(self, row: VersionRow, updates: Sequence[LoggedUpdate]) -> None:
        base_evals = [
            u.metrics["base_eval_return"] for u in updates if "base_eval_return" in u.metrics
        ]
        line = {
            "session": self._session,
            "version": row.version,
            "parent": row.parent,
            "time_unix_ms": row.created_ms,
            "updates": len(updates),
            "contributors": list(row.contributors),
            "max_staleness": row.max_staleness,
            "mean_staleness": float(np.mean([u.staleness for u in updates])) if updates else 0.0,
            "mean_return": row.mean_return,
            "base_eval_return": float(np.mean(base_evals)) if base_evals else None,
        }
        with self._metrics_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        if self._on_metrics is not None:
            self._on_metrics(line)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
