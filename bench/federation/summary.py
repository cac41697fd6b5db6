"""The figures over seeds: each arrangement's IQMs and intervals, each group's speed-ups.

Steps to target count an unsolved seed at its run's budget (its last mark),
CPU and wall seconds at its last mark: the IQM then stays a number, and a
configuration that often fails shows it in its interval rather than hiding
behind "never". A group's unsolved seeds count at the longest budget of its
comparison: where the lone references run longer (--offline-budget), a
group that stops sooner gains nothing by stopping. The mean score over
marks (the area under the greedy curve, normalised) is taken over the
marks every arrangement of a comparison has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Literal

from bench.federation.results import RunResult, cut
from bench.federation.settings import Configuration
from bench.federation.statistics import Estimate, iqm, iqm_interval, ratio_interval
from bench.federation.sweep import Measured, Reference

Headline = Literal["compute-matched lone", "default lone"]
LOSSLESS_TOLERANCE = 1.10
"""A lone member's IQM steps may be at most this multiple of the lone learner's (DESIGN.md:
federation is lossless for one)."""


@dataclass(frozen=True)
class ArrangementSummary:
    """One arrangement's runs over seeds."""

    configuration: Configuration
    seeds: list[int]
    solved: int
    per_seed_steps: list[int | None]
    """Steps to target per seed (None: unsolved)."""
    budget: int
    """Per-participant env steps of its runs: where an unsolved seed is counted."""
    steps: Estimate
    """IQM of steps to target, unsolved seeds at the budget."""
    mean_score: Estimate
    """IQM of the mean score over the comparison's marks."""
    cpu_to_target: Estimate
    """IQM of CPU seconds per participant to target, unsolved seeds to the last mark."""
    wall_to_target: Estimate
    """The same in wall-clock seconds."""
    cpu_per_1000_steps: float
    """IQM of CPU seconds per participant per 1,000 of its env steps, whole runs."""
    wall_per_1000_steps: float
    updates_per_step: float
    """Gradient updates per env step, whole runs, mean over seeds."""
    updates_per_step_at_horizon: float
    """The same to the comparison's horizon: what the compute matching compares."""
    own_solved: int
    """Seeds where participant 0's own model reached the target."""
    own_steps: Estimate
    own_per_seed_steps: list[int | None]
    one_version: int
    """Seeds whose target was reached by one global version scored at two marks."""


def summarise_runs(
    configuration: Configuration,
    runs: Sequence[RunResult],
    horizon: int,
    *,
    unsolved_at: int | None = None,
) -> ArrangementSummary:
    """The figures of one arrangement's runs (one per seed), its rates counted to `horizon`,
    its unsolved seeds at `unsolved_at` (None: each run's budget)."""
    if not runs:
        raise ValueError(f"{configuration.key} has no runs to summarise")

    def at(run: RunResult) -> int:
        return run.budget if unsolved_at is None else unsolved_at

    return ArrangementSummary(
        configuration=configuration,
        seeds=[r.seed for r in runs],
        solved=sum(r.steps_to_target is not None for r in runs),
        per_seed_steps=[r.steps_to_target for r in runs],
        budget=max(r.budget for r in runs),
        steps=iqm_interval([r.steps_or(at(r)) for r in runs]),
        mean_score=iqm_interval([r.mean_score(horizon) for r in runs]),
        cpu_to_target=iqm_interval([r.cpu_or_budget for r in runs]),
        wall_to_target=iqm_interval([r.seconds_or_budget for r in runs]),
        cpu_per_1000_steps=iqm([r.cpu_per_1000_steps for r in runs]),
        wall_per_1000_steps=iqm([r.wall_per_1000_steps for r in runs]),
        updates_per_step=fmean(r.updates_per_step for r in runs),
        updates_per_step_at_horizon=fmean(r.updates_per_step_at(horizon) for r in runs),
        own_solved=sum(r.own_steps_to_target is not None for r in runs),
        own_steps=iqm_interval([r.steps_or(at(r), own=True) for r in runs]),
        own_per_seed_steps=[r.own_steps_to_target for r in runs],
        one_version=sum(r.reached_on_one_version for r in runs),
    )


@dataclass(frozen=True)
class Lossless:
    """A lone member (N = 1 through the server) against the lone learner in as many steps."""

    steps_ratio: Estimate
    """IQM steps of the member over the lone learner's: at most 1.10 holds."""
    solved: int
    reference_solved: int
    """The lone learner's solved seeds within the member's budget."""

    @property
    def holds(self) -> bool:
        return self.steps_ratio.value <= LOSSLESS_TOLERANCE and self.solved >= self.reference_solved


@dataclass(frozen=True)
class Comparison:
    """A group beside its references, with its speed-up against each (reference IQM steps over
    the group's, 95 % interval from the stratified bootstrap)."""

    group: ArrangementSummary
    default_lone: ArrangementSummary
    compute_matched: ArrangementSummary
    pooled: ArrangementSummary
    compute_matched_reference: Reference
    pooled_reference: Reference
    horizon: int
    vs_default_lone: Estimate
    vs_compute_matched: Estimate
    vs_pooled: Estimate
    own_vs_compute_matched: Estimate
    """Participant 0's own model against the compute-matched lone learner."""
    headline: Headline
    """The stronger lone reference: the one with fewer IQM steps to target."""
    lossless: Lossless | None
    """Only at N = 1."""

    @property
    def headline_speedup(self) -> Estimate:
        return (
            self.vs_compute_matched
            if self.headline == "compute-matched lone"
            else self.vs_default_lone
        )

    @property
    def target_speedup(self) -> float | None:
        """The issue's 0.8·N against the compute-matched lone learner (groups only)."""
        n = self.group.configuration.n
        return 0.8 * n if n > 1 else None

    @property
    def target_met(self) -> bool | None:
        """At least 0.8·N against the compute-matched lone learner, its interval above 1."""
        if self.target_speedup is None:
            return None
        speedup = self.vs_compute_matched
        return speedup.value >= self.target_speedup and speedup.low > 1.0


def compare(measured: Measured) -> Comparison:
    """The summaries and speed-ups of one measured group."""
    horizon = measured.compute_matched.horizon
    group = measured.runs
    references = (measured.default_lone, measured.compute_matched, measured.pooled)
    longest = max(r.budget for runs in (group, *(x.runs for x in references)) for r in runs)
    steps = [r.steps_or(longest) for r in group]
    default, matched, pooled = (
        summarise_runs(x.configuration, x.runs, horizon) for x in references
    )
    headline: Headline = (
        "default lone" if default.steps.value < matched.steps.value else "compute-matched lone"
    )

    def against(reference: Reference) -> Estimate:
        return ratio_interval([r.steps_or_budget for r in reference.runs], steps)

    return Comparison(
        group=summarise_runs(measured.group, group, horizon, unsolved_at=longest),
        default_lone=default,
        compute_matched=matched,
        pooled=pooled,
        compute_matched_reference=measured.compute_matched,
        pooled_reference=measured.pooled,
        horizon=horizon,
        vs_default_lone=against(measured.default_lone),
        vs_compute_matched=against(measured.compute_matched),
        vs_pooled=against(measured.pooled),
        own_vs_compute_matched=ratio_interval(
            [r.steps_or_budget for r in measured.compute_matched.runs],
            [r.steps_or(longest, own=True) for r in group],
        ),
        headline=headline,
        lossless=lossless(group, measured.default_lone.runs) if measured.group.n == 1 else None,
    )


def lossless(member: Sequence[RunResult], lone: Sequence[RunResult]) -> Lossless:
    """The lone member against the lone learner's runs cut to the member's budget: a lone
    member's own model is the lone learner's run for run, so it can only be held to what the
    lone learner reached in as many steps (a longer reference run is for the groups)."""
    budget = max(r.budget for r in member)
    within_budget = [cut(r, budget) for r in lone]
    return Lossless(
        steps_ratio=ratio_interval(
            [r.steps_or_budget for r in member], [r.steps_or_budget for r in within_budget]
        ),
        solved=sum(r.steps_to_target is not None for r in member),
        reference_solved=sum(r.steps_to_target is not None for r in within_budget),
    )
