"""Committing a global version: durable files, then its row; then housekeeping.

A version the aggregator computed becomes visible in this order, which is
what makes a kill -9 at any instant recoverable:

1. the checkpoint file is written, fsynced and renamed (ModelStore.write),
   and so is the strategy's velocity when it carries one (server momentum),
   beside it in the session's momentum/ folder;
2. the version row and the acks it folds in are committed in one transaction;
3. only then may the aggregator show it to readers (the caller does);
4. housekeeping: the metrics line, the update log trimmed below every update
   not yet in a version, checkpoints and velocities outside retention deleted.

A crash before 2 leaves files no row names: recovery deletes them
(ModelStore.discard_after) and recomputes the version from the log. Every
step of 4 is redone or harmless after a crash.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fedrl.server.storage.db_runner import DbRunner
from fedrl.server.storage.model_store import ModelStore
from fedrl.server.storage.state_db import VersionRow
from fedrl.server.storage.update_log import UpdateLog
from fedrl.server.storage.update_record import LoggedUpdate

log = logging.getLogger(__name__)

T = TypeVar("T")

VELOCITY_DIR = "momentum"
"""Beside a session's checkpoints: the strategy's velocity after each version (server momentum)."""


class Versions:
    """Writes one session's versions (the module docstring's order) on a thread of its own."""

    def __init__(
        self,
        *,
        session: str,
        names: Sequence[str],
        store: ModelStore,
        velocities: ModelStore,
        update_log: UpdateLog,
        db: DbRunner,
        data_dir: Path,
        metrics_path: Path,
        discard_watermark: Callable[[], Awaitable[int]],
        best_version: int = -1,
        on_metrics: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._session = session
        self._names = list(names)
        self._store = store
        self._velocities = velocities
        self._log = update_log
        self._db = db
        self._data_dir = data_dir
        self._metrics_path = metrics_path
        self._discard_watermark = discard_watermark
        self._best_version = best_version
        self._on_metrics = on_metrics
        """Also given each version's metrics line (e.g. for TensorBoard), on the commit thread."""
        # A commit's fsyncs never hold up the aggregator accumulating the next buffer.
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"fedrl-commit-{session}")

    def note_best(self, version: int) -> None:
        """Tell retention which version has the best evaluation return."""
        self._best_version = version

    def close(self) -> None:
        self._io.shutdown(wait=True)

    async def commit(
        self,
        version: int,
        *,
        parent: int,
        tensors: Sequence[np.ndarray],
        velocity: Sequence[np.ndarray] | None,
        updates: Sequence[LoggedUpdate],
        seeded_by: str | None = None,
    ) -> VersionRow:
        """Steps 1 and 2: the files, then the row; raises, leaving nothing, if either fails."""
        path = await self._in_io(self._store.write, version, self._named(tensors))
        try:
            if velocity is not None:
                await self._in_io(self._velocities.write, version, self._named(velocity))
            row = self._row(version, parent, path, updates, seeded_by)
            applied = [(u.participant_id, u.sequence) for u in updates]
            await self._db(lambda db: db.commit_version(row, applied))
        except BaseException:
            # Never committed, so never visible; the retry may fold a different
            # buffer into this version number, and checkpoints are immutable.
            await self._in_io(self._forget, version)
            raise
        return row

    async def keep_house(self, row: VersionRow, updates: Sequence[LoggedUpdate]) -> None:
        """Step 4; a failure is logged, and the next version's housekeeping retries it."""
        try:
            watermark = await self._discard_watermark()
            pruned = await self._in_io(self._after_commit, row, updates, watermark)
            if pruned:
                # A crash before this leaves a checkpoint name whose file is
                # gone: Status shows it, PullModel answers NOT_FOUND. Harmless.
                await self._db(lambda db: db.mark_pruned(self._session, pruned))
        except Exception:
            log.exception(
                "session %r: housekeeping after version %d failed", self._session, row.version
            )

    async def _in_io(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, call, *args)

    def _named(self, tensors: Sequence[np.ndarray]) -> list[tuple[str, np.ndarray]]:
        return list(zip(self._names, tensors, strict=True))

    def _row(
        self,
        version: int,
        parent: int,
        path: Path,
        updates: Sequence[LoggedUpdate],
        seeded_by: str | None,
    ) -> VersionRow:
        returns = [u.metrics["mean_return"] for u in updates if "mean_return" in u.metrics]
        return VersionRow(
            session=self._session,
            version=version,
            parent=parent,
            created_ms=int(time.time() * 1000),
            lsn=max((u.lsn for u in updates), default=self._log.last_lsn),
            contributors=(seeded_by,)
            if seeded_by
            else tuple(dict.fromkeys(u.participant_id for u in updates)),
            max_staleness=max((u.staleness for u in updates), default=0),
            mean_return=float(np.mean(returns)) if returns else None,
            checkpoint=_relative(path, self._data_dir),
        )

    def _forget(self, version: int) -> None:
        for store in (self._store, self._velocities):
            store.path(version).unlink(missing_ok=True)

    def _after_commit(
        self, row: VersionRow, updates: Sequence[LoggedUpdate], watermark: int
    ) -> list[int]:
        """Housekeeping after the commit; each step is redone or harmless after a crash."""
        self._append_metrics(row, updates)
        self._log.discard_through(watermark)
        # The next version starts from this one's velocity; older ones are never read again.
        self._velocities.discard_before(row.version)
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
