"""The metrics line a federation event leaves in the state dir's metrics.jsonl."""

from __future__ import annotations

import time
from typing import Any

from fedrl.client.training.counters import Counters


def event_record(kind: str, counters: Counters, **fields: Any) -> dict[str, Any]:
    """`kind` ("sync", "adopt", "score", "report", ...) at this time and training position.

    Fields given as None are left out rather than written as null, so a plot
    reads a missing figure as absent, not as a value.
    """
    record: dict[str, Any] = {
        "kind": kind,
        "time": round(time.time(), 3),
        "episode": counters.episodes,
        "env_steps": counters.env_steps,
    }
    record.update({key: value for key, value in fields.items() if value is not None})
    return record
