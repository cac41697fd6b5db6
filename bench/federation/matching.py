"""Compute matching: the replay ratio at which a learner makes a group's updates per env step.

A group member's updates per own env step come from its replay ratio and
the credit of the others' transitions; a lone learner's from its replay
ratio alone, counted from the step its replay first holds `learning_starts`
transitions (the engine's warm-up). Over H steps a learner at replay ratio r
that starts updating after w steps makes about r·(H − w)/H updates per step,
so the first guess for a target rate u is u·H/(H − w). Whatever the guess
misses by (rounding to batches of steps, a learner that starts late) the
measured rate corrects: r ← r·u/measured, until the two agree within 5 %.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

TOLERANCE = 0.05
"""How far a reference's updates per step may be from the group's: 5 %."""
TRIES = 4
"""Replay ratios tried before a reference runs with the last one, marked unmatched."""


class MatchingError(ValueError):
    """No replay ratio can make a rate: no updates to match, or none made within the steps."""


@dataclass(frozen=True)
class Attempt:
    """One replay ratio tried, and the updates per env step it made."""

    replay_ratio: float
    achieved: float


def first_guess(target: float, horizon: int, ready_at: float) -> float:
    """The replay ratio that makes `target` updates per step over `horizon` steps when updates
    start after `ready_at` steps."""
    if target <= 0:
        raise MatchingError(f"a target rate must be positive to be matched, got {target}")
    if ready_at >= horizon:
        raise MatchingError(
            f"updates start after {ready_at:,.0f} steps, at or past the {horizon:,} the rates are "
            "compared over: raise the budget or lower learning_starts (--learner)"
        )
    return target * horizon / (horizon - ready_at)


def within(achieved: float, target: float, tolerance: float = TOLERANCE) -> bool:
    """Whether `achieved` updates per step match `target` within `tolerance` (relative)."""
    if target == 0:
        return achieved == 0
    return abs(achieved / target - 1) <= tolerance


def corrected(attempt: Attempt, target: float) -> float:
    """The next replay ratio: the last one scaled by how far its rate fell from the target."""
    if attempt.achieved <= 0:
        raise MatchingError(
            f"replay ratio {attempt.replay_ratio:.4g} made no updates within the steps compared: "
            "raise the budget or lower learning_starts (--learner)"
        )
    return attempt.replay_ratio * target / attempt.achieved


def match(
    target: float,
    guess: float,
    measure: Callable[[float], float],
    *,
    tolerance: float = TOLERANCE,
    tries: int = TRIES,
) -> list[Attempt]:
    """Replay ratios tried from `guess`, each measured (`measure(ratio)` runs a learner and
    returns its updates per step), until one is within `tolerance` of `target` or `tries` are
    spent. The last attempt is the one to use; the caller checks `within` on it."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    attempts = [Attempt(guess, measure(guess))]
    while len(attempts) < tries and not within(attempts[-1].achieved, target, tolerance):
        ratio = corrected(attempts[-1], target)
        attempts.append(Attempt(ratio, measure(ratio)))
    return attempts
