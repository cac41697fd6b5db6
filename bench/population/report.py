"""The bench's figures: per seed and arm, then IQMs with 95 % intervals over seeds.

Per seed and arm: the best member's env steps to the target (the fewest of
any member's own env steps; a copier's count includes the steps it trained
before it copied) and the best member's final evaluation (the highest last
evaluation of any member), and the CPU seconds each member used. Over
seeds: interquartile means with stratified-bootstrap intervals
(bench.federation.statistics), an arm that never reached the target counted
at the budget (so its IQM is a lower bound), and the speed-up of each
population over its independent runs: their steps over its steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from bench.federation.statistics import Estimate, describe, iqm_interval, ratio_interval
from bench.population.runs import MemberOutcome
from bench.population.settings import Settings


@dataclass(frozen=True)
class ArmSeed:
    """One arm of one seed: its members' outcomes."""

    seed: int
    arm: str
    members: tuple[MemberOutcome, ...]

    @property
    def steps_to_target(self) -> int | None:
        reached = [m.steps_to_target for m in self.members if m.steps_to_target is not None]
        return min(reached) if reached else None

    @property
    def best_final(self) -> float:
        return max(m.final_eval for m in self.members if m.final_eval is not None)

    @property
    def cpu_per_member(self) -> float:
        return float(np.mean([m.cpu_s for m in self.members]))


def arms(
    results: Sequence[tuple[int, str, list[MemberOutcome]]], settings: Settings
) -> list[ArmSeed]:
    """Every (seed, arm) the results make: the independent runs of the largest size give each
    smaller size's independent arm as their first n members."""
    found = []
    for seed, arm, members in results:
        if arm == "independent":
            ordered = sorted(members, key=lambda m: int(m.name[1:]))
            found += [ArmSeed(seed, f"independent {n}", tuple(ordered[:n])) for n in settings.sizes]
        else:
            found.append(ArmSeed(seed, arm, tuple(members)))
    return sorted(found, key=lambda a: (a.seed, arm_order(a.arm, settings)))


def arm_order(arm: str, settings: Settings) -> int:
    names = ["default"]
    for n in settings.sizes:
        names += [f"independent {n}", f"population {n}"]
    return names.index(arm)


def summary(found: Sequence[ArmSeed], settings: Settings) -> dict[str, object]:
    """Per arm over seeds: IQM and interval of steps to target and of final evaluation; per
    size, the population's speed-up over its independent runs."""
    budget = settings.task.steps
    by_arm: dict[str, list[ArmSeed]] = {}
    for entry in found:
        by_arm.setdefault(entry.arm, []).append(entry)
    figures: dict[str, object] = {}
    for arm, entries in by_arm.items():
        steps = [e.steps_to_target or budget for e in entries]
        figures[arm] = {
            "seeds": len(entries),
            "reached": sum(e.steps_to_target is not None for e in entries),
            "steps_to_target": asdict(iqm_interval(steps)),
            "best_final_eval": asdict(iqm_interval([e.best_final for e in entries])),
            "cpu_s_per_member": float(np.mean([e.cpu_per_member for e in entries])),
        }
    speedups = {}
    for n in settings.sizes:
        pair = {e.seed: e for e in by_arm.get(f"independent {n}", [])}
        population = [e for e in by_arm.get(f"population {n}", []) if e.seed in pair]
        if population:
            independent = [pair[e.seed].steps_to_target or budget for e in population]
            together = [e.steps_to_target or budget for e in population]
            speedups[str(n)] = asdict(ratio_interval(independent, together))
    return {"arms": figures, "speedup": speedups}


def per_seed_lines(found: Sequence[ArmSeed], settings: Settings) -> list[str]:
    target = settings.task.target
    lines = [
        f"{'seed':>4} {'arm':>14} {f'steps to {target:g}':>15} {'best final eval':>16} "
        f"{'CPU s/member':>13} {'exploits':>9}"
    ]
    for e in found:
        steps = "-" if e.steps_to_target is None else f"{e.steps_to_target:,}"
        exploits = sum(m.exploits for m in e.members)
        lines.append(
            f"{e.seed:>4} {e.arm:>14} {steps:>15} {e.best_final:>16.1f} "
            f"{e.cpu_per_member:>13.0f} {exploits:>9}"
        )
    return lines


def summary_lines(figures: dict[str, object], settings: Settings) -> list[str]:
    """The IQM table, then each size's speed-up."""
    arms_figures = figures["arms"]
    assert isinstance(arms_figures, dict)
    lines = [
        f"{'arm':>14} {'reached':>8} {'steps to target, IQM [95% CI]':>32} "
        f"{'best final eval, IQM [95% CI]':>30} {'CPU s/member':>13}"
    ]
    for arm in sorted(arms_figures, key=lambda a: arm_order(a, settings)):
        f = arms_figures[arm]
        steps, final = Estimate(**f["steps_to_target"]), Estimate(**f["best_final_eval"])
        lines.append(
            f"{arm:>14} {f['reached']:>3}/{f['seeds']:<4} {describe(steps):>32} "
            f"{describe(final, ',.1f'):>30} {f['cpu_s_per_member']:>13.0f}"
        )
    speedups = figures["speedup"]
    assert isinstance(speedups, dict)
    for n, ratio in speedups.items():
        lines.append(
            f"population {n} over independent {n}: steps to target "
            f"{describe(Estimate(**ratio), '.2f')}x (above 1: the population is faster)"
        )
    return lines
