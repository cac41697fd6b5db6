"""The sweep: each group on every seed, then the references it is measured against.

Every group configuration gets three references, all on the same seeds:
the lone learner at the engine's defaults (one set of runs for the whole
invocation), a lone learner with the group's updates per own env step (the
compute-matched one), and one learner with all N participants' envs whose
updates per env step are the group's too (pooled: the group's total
compute in one learner). The group runs first: its measured updates per
env step, to the last mark both it and the lone learners have, is the rate
the references must match within 5 % (bench.federation.matching). A
reference already run whose rate matches is used again, not rerun: the
defaults often match a lone member, and the pairs of two modes often match
each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from bench.federation.matching import (
    Attempt,
    MatchingError,
    corrected,
    first_guess,
    match,
    within,
)
from bench.federation.participant import DEFAULT_REPLAY_RATIO, learning_starts
from bench.federation.results import RunResult, updates_per_step_at
from bench.federation.settings import Algorithm, Configuration, Settings, default_lone

RunOne = Callable[[Configuration, int], RunResult]
Candidate = tuple[Configuration, list[RunResult], tuple[Attempt, ...]]
"""A reference's configuration, its runs, and the replay ratios tried to find it."""


@dataclass(frozen=True)
class Reference:
    """A lone or pooled learner's runs beside one group, and how its compute compares."""

    configuration: Configuration
    runs: list[RunResult]
    target: float
    """The group's updates per env step to `horizon`, the mean over seeds."""
    achieved: float
    """This reference's, the same way."""
    horizon: int
    """Per-participant env steps the rates are counted to: the last mark all runs have."""
    attempts: tuple[Attempt, ...] = ()
    """Replay ratios tried on the first seed before these runs (none: not calibrated here)."""

    @property
    def matched(self) -> bool:
        """Updates per env step within 5 % of the group's."""
        return within(self.achieved, self.target)


@dataclass(frozen=True)
class Measured:
    """One group configuration and its three references."""

    group: Configuration
    runs: list[RunResult]
    default_lone: Reference
    compute_matched: Reference
    """A lone learner at the group's updates per own env step."""
    pooled: Reference
    """One learner with the group's envs at its updates per env step (at N = 1: the
    compute-matched lone learner, which is what one participant's pool is)."""


class Sweep:
    """Runs groups and references through `run`, each reference calibrated or reused."""

    def __init__(
        self,
        run: RunOne,
        seeds: Sequence[int],
        settings: Settings,
        *,
        say: Callable[[str], None] = print,
    ) -> None:
        if not seeds:
            raise ValueError("a sweep needs at least one seed")
        self._run = run
        self._seeds = list(seeds)
        self._settings = settings
        self._say = say
        self._lone: dict[Algorithm, list[RunResult]] = {}
        self._references: list[Candidate] = []
        """Every calibrated reference run so far, for reuse."""

    def default_lone(self, algo: Algorithm) -> list[RunResult]:
        """The lone learner at the engine's defaults on every seed, run once per algorithm."""
        if algo not in self._lone:
            configuration = default_lone(algo)
            self._lone[algo] = [self._run(configuration, seed) for seed in self._seeds]
        return self._lone[algo]

    def measure(self, group: Configuration) -> Measured:
        """The group on every seed, then its references."""
        lone = self.default_lone(group.algo)
        runs = [self._run(group, seed) for seed in self._seeds]
        horizon = min(runs[0].budget, lone[0].budget)
        target = updates_per_step_at(runs, horizon)
        if target <= 0:
            raise MatchingError(
                f"{group.key} made no updates within {horizon:,} steps each: nothing to match; "
                "raise the budget or lower learning_starts (--learner)"
            )
        self._say(
            f"{group.key}: {target:.3f} updates per own env step to {horizon:,} steps; "
            "matching its references"
        )
        default = Reference(
            default_lone(group.algo), lone, target, updates_per_step_at(lone, horizon), horizon
        )
        matched = self._matched(Configuration(1, "offline", group.algo), target, horizon, default)
        pooled = (
            matched
            if group.n == 1
            else self._matched(Configuration(group.n, "pooled", group.algo), target, horizon)
        )
        self._say(describe_reference(default))
        if matched.configuration == default.configuration:
            self._say("  the default lone learner is the compute-matched one")
        else:
            self._say(describe_reference(matched))
        if group.n > 1:
            self._say(describe_reference(pooled))
        return Measured(group, runs, default, matched, pooled)

    def _matched(
        self,
        base: Configuration,
        target: float,
        horizon: int,
        default: Reference | None = None,
    ) -> Reference:
        """A reference like `base` at the group's rate: one already run that matches (the
        default lone learner first), else calibrated on the first seed and run on all."""
        candidates: list[Candidate] = (
            [] if default is None else [(default.configuration, default.runs, ())]
        )
        candidates += [c for c in self._references if _alike(c[0], base)]
        known: list[Attempt] = []
        for configuration, runs, attempts in candidates:
            achieved = updates_per_step_at(runs, horizon)
            if within(achieved, target):
                return Reference(configuration, runs, target, achieved, horizon, attempts)
            known.append(Attempt(replay_ratio_of(configuration), achieved))
        if base.algo == "ppo":
            # PPO's updates per step follow from its rollout and epochs, not a replay ratio:
            # its references run at its own settings and say whether they match.
            if default is not None:
                return default
            runs = [self._run(base, seed) for seed in self._seeds]
            self._references.append((base, runs, ()))
            return Reference(base, runs, target, updates_per_step_at(runs, horizon), horizon)
        configuration, runs, attempts = self._calibrated(base, target, horizon, known)
        self._references.append((configuration, runs, attempts))
        return Reference(
            configuration, runs, target, updates_per_step_at(runs, horizon), horizon, attempts
        )

    def _calibrated(
        self, base: Configuration, target: float, horizon: int, known: Sequence[Attempt]
    ) -> tuple[Configuration, list[RunResult], tuple[Attempt, ...]]:
        """Replay ratios tried on the first seed until its rate matches, then the other seeds
        at the ratio found; the first seed's run at that ratio is kept. The first ratio comes
        from the closest learner of the same kind already run (its updates per step scale with
        its replay ratio), else from the warm-up (bench.federation.matching)."""
        first = self._seeds[0]
        tried: list[RunResult] = []

        def measure(ratio: float) -> float:
            tried.append(self._run(replace(base, replay_ratio=ratio), first))
            return tried[-1].updates_per_step_at(horizon)

        useful = [a for a in known if a.achieved > 0]
        if useful:
            guess = corrected(min(useful, key=lambda a: abs(a.achieved - target)), target)
        else:
            guess = first_guess(target, horizon, learning_starts(self._settings) / base.pooled_over)
        attempts = match(target, guess, measure)
        configuration = replace(base, replay_ratio=attempts[-1].replay_ratio)
        runs = [tried[-1], *(self._run(configuration, seed) for seed in self._seeds[1:])]
        return configuration, runs, tuple(attempts)


def replay_ratio_of(configuration: Configuration) -> float:
    """The replay ratio a configuration's engines run at."""
    return (
        DEFAULT_REPLAY_RATIO if configuration.replay_ratio is None else configuration.replay_ratio
    )


def _alike(configuration: Configuration, base: Configuration) -> bool:
    """Whether a reference run for another group can stand for `base` (its replay ratio aside)."""
    return replace(configuration, replay_ratio=None) == replace(base, replay_ratio=None)


def describe_reference(reference: Reference) -> str:
    """One line: the reference, its updates per step against the group's, how it was found."""
    tried = ", ".join(f"{a.replay_ratio:.3g} -> {a.achieved:.3f}" for a in reference.attempts)
    how = f" (replay ratios tried on the first seed: {tried})" if tried else ""
    verdict = "within 5 %" if reference.matched else "not within 5 %"
    return (
        f"  {reference.configuration.key}: {reference.achieved:.3f} updates per env step against "
        f"the group's {reference.target:.3f}, {verdict}{how}"
    )
