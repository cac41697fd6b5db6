"""Which config fields a running learner may change (population-based training)."""

from __future__ import annotations

import dataclasses
from typing import Any


def refuse_fixed_changes(
    before: Any, after: Any, reconfigurable: frozenset[str], *, algorithm: str
) -> None:
    """ValueError when the config `after` differs from `before` outside `reconfigurable`: a
    running learner built its networks, replay and optimizer from those fields."""
    changed = sorted(
        f.name
        for f in dataclasses.fields(after)
        if f.name not in reconfigurable and getattr(before, f.name) != getattr(after, f.name)
    )
    if changed:
        raise ValueError(f"a running {algorithm} learner cannot change {changed}")
