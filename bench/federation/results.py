"""What a run produced: each participant's costs, the scores at every mark, the figures per run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import fmean

from bench.federation.participant import ParticipantReport
from bench.federation.scoring import reached_at
from bench.federation.settings import Configuration


@dataclass(frozen=True)
class RunResult:
    """One seed of one configuration: the score at every mark and what it cost."""

    configuration: Configuration
    seed: int
    marks: list[int]
    """Per-participant env steps of each mark."""
    returns: list[float]
    """Score at each mark."""
    seconds: list[float]
    """Wall clock from the common start to each mark (the median over participants where a
    global model is scored, participant 0's own time where its local model is)."""
    versions: list[int]
    """Global version scored at each mark (-1: participant 0's local model)."""
    own_returns: list[float]
    """Score of participant 0's own model at each mark: the agent a member holds (the same
    as `returns` where that is what is scored; in "roles" participant 0 is the learner)."""
    initial_return: float
    """Score of the network every participant started from (version 0)."""
    participants: list[ParticipantReport]
    total_versions: int
    run_seconds: float
    server_cpu_seconds: float
    """CPU of the server process over the run (0 without a server)."""
    target: float

    @property
    def budget(self) -> int:
        """Per-participant env steps of the last mark: where an unsolved seed is counted."""
        return self.marks[-1]

    @property
    def reached(self) -> int | None:
        """Index of the mark at which the target was reached (two consecutive marks)."""
        return reached_at(self.returns, self.target)

    @property
    def steps_to_target(self) -> int | None:
        index = self.reached
        return None if index is None else self.marks[index]

    def steps_or(self, unsolved: int, *, own: bool = False) -> int:
        """Steps to target (participant 0's own model's with `own`), an unsolved run counted at
        `unsolved` (its budget or more)."""
        steps = self.own_steps_to_target if own else self.steps_to_target
        return unsolved if steps is None else steps

    @property
    def steps_or_budget(self) -> int:
        """Steps to target, an unsolved run counted at its budget."""
        return self.steps_or(self.budget)

    @property
    def own_steps_to_target(self) -> int | None:
        """Steps to target of participant 0's own model, two consecutive marks as for any."""
        index = reached_at(self.own_returns, self.target)
        return None if index is None else self.marks[index]

    @property
    def reached_on_one_version(self) -> bool:
        """Whether the two marks that reached the target scored the same global version.

        Versions can come rarer than marks (a sync every 2 episodes of 500
        steps), and then one model scored twice passes the test meant to
        show that a learner stays good while it trains on; a lone learner's
        two marks always score two models.
        """
        index = self.reached
        return index is not None and self.versions[index] == self.versions[index + 1] >= 0

    @property
    def first_mark_at_target(self) -> int | None:
        """The first single mark at or above the target: the less strict figure."""
        index = reached_at(self.returns, self.target, consecutive=1)
        return None if index is None else self.marks[index]

    @property
    def seconds_to_target(self) -> float | None:
        """Wall clock per participant to the target (a pooled learner's, divided by N)."""
        index = self.reached
        return None if index is None else self.seconds[index] / self.configuration.pooled_over

    @property
    def seconds_or_budget(self) -> float:
        """Wall clock per participant to the target, an unsolved run's to its last mark."""
        index = len(self.marks) - 1 if self.reached is None else self.reached
        return self.seconds[index] / self.configuration.pooled_over

    @property
    def cpu_to_target(self) -> float | None:
        """CPU seconds each participant had spent when the target was reached (mean; a pooled
        learner's divided by N)."""
        index = self.reached
        return None if index is None else self.cpu_at(index)

    @property
    def cpu_or_budget(self) -> float:
        """CPU seconds per participant to the target, an unsolved run's to its last mark."""
        return self.cpu_at(len(self.marks) - 1 if self.reached is None else self.reached)

    def cpu_at(self, index: int) -> float:
        share = self.configuration.pooled_over
        return fmean(p.mark_cpu[index] / share for p in self.participants)

    @property
    def updates_per_step(self) -> float:
        """Gradient updates per env step over the whole run, every process's together (actors
        count 0): what each participant spends per own env step."""
        steps = sum(p.env_steps for p in self.participants)
        return sum(p.updates for p in self.participants) / max(1, steps)

    def updates_per_step_at(self, mark: int) -> float:
        """The same, counted from the start to `mark` (per-participant env steps): runs of
        different budgets compare over the same steps."""
        if mark not in self.marks:
            raise ValueError(f"{mark:,} is not a mark of {self.configuration.key}")
        index = self.marks.index(mark)
        steps = sum(p.mark_steps[index] for p in self.participants)
        return sum(p.mark_updates[index] for p in self.participants) / max(1, steps)

    @property
    def steps_per_participant(self) -> float:
        """Env steps each participant took (a pooled learner's divided by N)."""
        share = self.configuration.pooled_over
        return fmean(p.env_steps / share for p in self.participants)

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds per participant for the whole run (a pooled learner's divided by N)."""
        share = self.configuration.pooled_over
        return fmean(p.cpu_seconds / share for p in self.participants)

    @property
    def wall_seconds(self) -> float:
        """Wall clock per participant for the whole run (a pooled learner's divided by N)."""
        return self.run_seconds / self.configuration.pooled_over

    @property
    def cpu_per_1000_steps(self) -> float:
        return 1_000 * self.cpu_seconds / self.steps_per_participant

    @property
    def wall_per_1000_steps(self) -> float:
        return 1_000 * self.wall_seconds / self.steps_per_participant

    def mean_score(self, until: int) -> float:
        """Mean score over the marks up to `until`: the area under the curve, normalised."""
        scores = [v for m, v in zip(self.marks, self.returns, strict=True) if m <= until]
        if not scores:
            raise ValueError(f"{self.configuration.key} has no mark up to {until:,}")
        return fmean(scores)

    @property
    def foreign_received(self) -> int:
        return sum(p.foreign_received for p in self.participants)

    @property
    def throttled(self) -> int:
        return sum(p.throttled for p in self.participants)


def cut(result: RunResult, budget: int) -> RunResult:
    """The run as scored up to `budget` env steps each: its marks beyond it dropped."""
    kept = sum(mark <= budget for mark in result.marks)
    return replace(
        result,
        marks=result.marks[:kept],
        returns=result.returns[:kept],
        seconds=result.seconds[:kept],
        versions=result.versions[:kept],
        own_returns=result.own_returns[:kept],
    )


def updates_per_step_at(runs: Sequence[RunResult], mark: int) -> float:
    """Gradient updates per env step to `mark`, the mean over runs (seeds)."""
    return fmean(r.updates_per_step_at(mark) for r in runs)
