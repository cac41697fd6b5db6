"""The server's per-version figures as TensorBoard scalars: one run per session.

The same figures as the server's metrics.jsonl line of each version, under
`<data-dir>/tensorboard/<session>/` (so `tensorboard --logdir
<data-dir>/tensorboard` shows the sessions side by side), stepped by version
number: `version/updates`, `version/contributors` (how many), the staleness
figures, `version/mean_return` (the training returns the updates reported)
and `version/base_eval_return` (greedy evaluations of the versions those
updates started from).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fedrl.common.event_files import ScalarEvents
from fedrl.common.identity import safe_dirname

_FIGURES = ("updates", "max_staleness", "mean_staleness", "mean_return", "base_eval_return")
"""Numeric fields of a version's metrics line that are drawn as they are."""


class VersionEvents:
    """Event files of every session under `root`, written as versions are committed.

    Each session's aggregator writes from its own commit thread, so the map
    of open files is guarded; a session's own writes never overlap.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._sessions: dict[str, ScalarEvents] = {}
        self._lock = threading.Lock()

    def write(self, line: dict[str, Any]) -> None:
        """One version's metrics line (as the aggregator appends it to metrics.jsonl)."""
        scalars = {f"version/{name}": line[name] for name in _FIGURES if line.get(name) is not None}
        scalars["version/contributors"] = len(line["contributors"])
        events = self._events(str(line["session"]))
        events.add(scalars, step=int(line["version"]), wall_time=line["time_unix_ms"] / 1000)
        events.flush()

    def close(self) -> None:
        with self._lock:
            for events in self._sessions.values():
                events.close()
            self._sessions.clear()

    def _events(self, session: str) -> ScalarEvents:
        with self._lock:
            events = self._sessions.get(session)
            if events is None:
                events = ScalarEvents(self.root / safe_dirname(session))
                self._sessions[session] = events
            return events
