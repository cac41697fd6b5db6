"""What the bench prints: a line per run, a table per group with its references and speed-ups,
and the JSON object of every figure on the last line."""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
import torch

from bench.federation import statistics
from bench.federation.results import RunResult
from bench.federation.settings import MODE_NAMES, Configuration, Settings
from bench.federation.statistics import Estimate, describe, describe_speedup
from bench.federation.summary import LOSSLESS_TOLERANCE, ArrangementSummary, Comparison
from bench.federation.sweep import Reference, replay_ratio_of
from bench.provenance import commit


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _dashes(values: Sequence[int | None]) -> str:
    return "[" + ", ".join("-" if v is None else f"{v}" for v in values) + "]"


def run_line(result: RunResult) -> str:
    """One run's figures, printed as it ends."""
    curve = " ".join(f"{v:.0f}" for v in result.returns)
    own = (
        ""
        if result.configuration.scores_local_model
        else (
            f"{', one version scored twice' if result.reached_on_one_version else ''}; "
            f"participant 0's own model {_fmt(result.own_steps_to_target, ',')}"
        )
    )
    return (
        f"{result.configuration.key} seed {result.seed}: target at "
        f"{_fmt(result.steps_to_target, ',')} steps/participant "
        f"(first mark {_fmt(result.first_mark_at_target, ',')}{own}), "
        f"{_fmt(result.seconds_to_target, '.0f')} s, {_fmt(result.cpu_to_target, '.1f')} CPU s; "
        f"{result.updates_per_step:.2f} updates/step, {result.cpu_seconds:.1f} CPU s/participant, "
        f"server {result.server_cpu_seconds:.1f} CPU s; {result.total_versions} versions, "
        f"{result.foreign_received:,} foreign transitions received, {result.throttled} pushes "
        f"throttled; {result.run_seconds:.0f} s; curve: {curve}"
    )


COLUMNS = (
    ("", 32),
    ("solved", 6),
    ("IQM steps/p [95% CI]", 26),
    ("IQM mean score", 18),
    ("upd/step", 8),
    ("CPU s/p→tgt", 11),
    ("wall s/p→tgt", 12),
    ("CPU s/1k", 8),
    ("wall s/1k", 9),
)


def _row(cells: Sequence[str]) -> str:
    first, *rest = cells
    return f"  {first:<{COLUMNS[0][1]}} " + " ".join(
        f"{cell:>{width}}" for cell, (_, width) in zip(rest, COLUMNS[1:], strict=True)
    )


def _arrangement_row(name: str, s: ArrangementSummary) -> str:
    return _row(
        (
            name,
            f"{s.solved}/{len(s.seeds)}",
            describe(s.steps),
            describe(s.mean_score),
            f"{s.updates_per_step_at_horizon:.2f}",
            f"{s.cpu_to_target.value:.1f}",
            f"{s.wall_to_target.value:.1f}",
            f"{s.cpu_per_1000_steps:.2f}",
            f"{s.wall_per_1000_steps:.2f}",
        )
    )


def _ratio(configuration: Configuration) -> str:
    """What sets its compute: the replay ratio, or PPO's rollouts and epochs."""
    if configuration.algo == "ppo":
        return "PPO's settings"
    return f"rr {replay_ratio_of(configuration):.2f}"


def comparison_lines(c: Comparison, cores: int) -> Iterator[str]:
    """One group: its row, its references' rows, its speed-ups against each."""
    group = c.group.configuration
    yield (
        f"\n{group.key}: {MODE_NAMES[group.mode]}; seeds {' '.join(map(str, c.group.seeds))}; "
        f"rates and mean scores to {c.horizon:,} steps each"
        + (
            f"; {group.n} participants on {cores} cores: compare CPU, not wall"
            if group.n > cores
            else ""
        )
    )
    yield _row([name for name, _ in COLUMNS])
    what = "p0's own model" if group.scores_local_model else "global model"
    yield _arrangement_row(f"group ({what})", c.group) + f"  {_dashes(c.group.per_seed_steps)}"
    if not group.scores_local_model:
        own = (
            "  participant 0's own model",
            f"{c.group.own_solved}/{len(c.group.seeds)}",
            describe(c.group.own_steps),
            *[""] * (len(COLUMNS) - 3),
        )
        yield _row(own) + f"  {_dashes(c.group.own_per_seed_steps)}"
    references = [
        (f"default lone ({_ratio(c.default_lone.configuration)})", c.default_lone, None),
        (
            f"compute-matched lone ({_ratio(c.compute_matched.configuration)})",
            c.compute_matched,
            c.compute_matched_reference,
        ),
    ]
    if group.n > 1:
        references.append(
            (
                f"pooled, {group.n} x envs ({_ratio(c.pooled.configuration)})",
                c.pooled,
                c.pooled_reference,
            )
        )
    for name, summary, reference in references:
        yield _arrangement_row(name, summary) + f"  {_dashes(summary.per_seed_steps)}"
        if reference is not None and not reference.matched:
            yield (
                f"    not compute-matched: {reference.achieved:.3f} updates per step against the "
                f"group's {reference.target:.3f} (more than 5 % apart)"
            )
    yield f"  speed-up vs default lone:          {describe_speedup(c.vs_default_lone)}"
    yield f"  speed-up vs compute-matched lone:  {describe_speedup(c.vs_compute_matched)}"
    if group.n > 1:
        yield f"  speed-up vs pooled:                {describe_speedup(c.vs_pooled)}"
    if not group.scores_local_model:
        yield f"  p0's own model vs compute-matched: {describe_speedup(c.own_vs_compute_matched)}"
    headline = (
        f"  headline, vs the stronger lone reference ({c.headline}): "
        f"{describe_speedup(c.headline_speedup)}"
    )
    if c.target_speedup is not None:
        headline += (
            f"; target >= {c.target_speedup:.1f}x vs compute-matched with its interval above 1: "
            f"{'met' if c.target_met else 'missed'}"
        )
    yield headline
    if c.lossless is not None:
        yield (
            f"  lossless for one: IQM steps x{describe(c.lossless.steps_ratio, '.2f')} of the "
            f"default lone learner's within {c.group.budget:,} steps (at most "
            f"{LOSSLESS_TOLERANCE:.2f}), solved {c.lossless.solved} against "
            f"{c.lossless.reference_solved}: {'holds' if c.lossless.holds else 'does not hold'}"
        )


def table_lines(
    comparisons: Sequence[Comparison], settings: Settings, seeds: Sequence[int], cores: int
) -> Iterator[str]:
    """The header, every group's lines, and what the columns mean."""
    yield (
        f"\n{settings.env}: score = mean of {settings.eval_episodes} greedy episodes; reached = "
        f">= {settings.target:g} at two consecutive marks (every {settings.eval_every:,} env "
        f"steps); budget {settings.budget_steps:,} env steps per participant, lone references "
        f"{settings.of('offline').budget_steps:,}; seeds {' '.join(map(str, seeds))}; each "
        "participant one thread (serial mode)"
    )
    for comparison in comparisons:
        yield from comparison_lines(comparison, cores)
    yield (
        "\nIQM: interquartile mean over seeds, an unsolved seed counted at its budget; "
        f"[95% CI]: percentile bootstrap, {statistics.REPS:,} resamples of the seeds within "
        f"each arrangement (seed {statistics.SEED}); speed-up: the reference's IQM steps over "
        'the group\'s, its interval from the same resamples, "no measurable gain" where it '
        "holds 1; mean score: over the marks every arrangement of the group has (the area "
        "under the curve); upd/step: gradient updates per own env step to that horizon; rr: "
        "replay ratio; s/p→tgt: CPU and wall seconds per participant to the target "
        "(unsolved: to the last mark), IQM; s/1k: per 1,000 env steps per participant, whole "
        "runs, IQM; a pooled learner's steps, updates, CPU and wall are divided by N. "
        "docs/federation-benchmark.md says more."
    )


def _interval(estimate: Estimate) -> list[float]:
    return [estimate.low, estimate.high]


def arrangement_figures(s: ArrangementSummary) -> dict[str, Any]:
    """One arrangement's figures for the JSON line."""
    return {
        "key": s.configuration.key,
        **asdict(s.configuration),
        "seeds": s.seeds,
        "solved": s.solved,
        "per_seed_steps": s.per_seed_steps,
        "budget_steps": s.budget,
        "iqm_steps": s.steps.value,
        "iqm_mean_score": s.mean_score.value,
        "iqm_cpu_seconds_to_target_per_participant": s.cpu_to_target.value,
        "iqm_wall_seconds_to_target_per_participant": s.wall_to_target.value,
        "cpu_seconds_per_1000_steps": s.cpu_per_1000_steps,
        "wall_seconds_per_1000_steps": s.wall_per_1000_steps,
        "updates_per_step": s.updates_per_step,
        "updates_per_step_to_horizon": s.updates_per_step_at_horizon,
        "own_solved": s.own_solved,
        "own_iqm_steps": s.own_steps.value,
        "own_per_seed_steps": s.own_per_seed_steps,
        "reached_on_one_version": s.one_version,
        "ci95": {
            "steps": _interval(s.steps),
            "mean_score": _interval(s.mean_score),
            "cpu_seconds_to_target_per_participant": _interval(s.cpu_to_target),
            "wall_seconds_to_target_per_participant": _interval(s.wall_to_target),
            "own_steps": _interval(s.own_steps),
        },
    }


def reference_figures(summary: ArrangementSummary, reference: Reference) -> dict[str, Any]:
    return {
        **arrangement_figures(summary),
        "group_updates_per_step_to_horizon": reference.target,
        "matched": reference.matched,
        "calibration": [asdict(a) for a in reference.attempts],
    }


def comparison_figures(c: Comparison) -> dict[str, Any]:
    """One group, its references and its speed-ups for the JSON line."""
    group = arrangement_figures(c.group)
    speedups = {
        "speedup_vs_default_lone": c.vs_default_lone,
        "speedup_vs_compute_matched": c.vs_compute_matched,
        "speedup_vs_pooled": c.vs_pooled,
        "own_speedup_vs_compute_matched": c.own_vs_compute_matched,
        "headline_speedup": c.headline_speedup,
    }
    return {
        **group,
        **{name: estimate.value for name, estimate in speedups.items()},
        "gain": {name: estimate.gain for name, estimate in speedups.items()},
        "ci95": {
            **group["ci95"],
            **{name: _interval(estimate) for name, estimate in speedups.items()},
        },
        "headline_reference": c.headline,
        "target_speedup": c.target_speedup,
        "target_met": c.target_met,
        "horizon_steps": c.horizon,
        "references": {
            "default_lone": arrangement_figures(c.default_lone),
            "compute_matched_lone": reference_figures(
                c.compute_matched, c.compute_matched_reference
            ),
            "pooled": reference_figures(c.pooled, c.pooled_reference),
        },
        "lossless": None
        if c.lossless is None
        else {
            "steps_ratio": c.lossless.steps_ratio.value,
            "ci95": _interval(c.lossless.steps_ratio),
            "solved": c.lossless.solved,
            "reference_solved": c.lossless.reference_solved,
            "holds": c.lossless.holds,
        },
    }


def run_figures(r: RunResult) -> dict[str, Any]:
    return {
        "key": r.configuration.key,
        **asdict(r.configuration),
        "seed": r.seed,
        "marks": r.marks,
        "returns": r.returns,
        "seconds": r.seconds,
        "versions": r.versions,
        "initial_return": r.initial_return,
        "steps_to_target": r.steps_to_target,
        "first_mark_at_target": r.first_mark_at_target,
        "reached_on_one_version": r.reached_on_one_version,
        "own_returns": r.own_returns,
        "own_steps_to_target": r.own_steps_to_target,
        "seconds_to_target": r.seconds_to_target,
        "cpu_seconds_to_target": r.cpu_to_target,
        "updates_per_step": r.updates_per_step,
        "cpu_seconds": r.cpu_seconds,
        "cpu_seconds_per_1000_steps": r.cpu_per_1000_steps,
        "wall_seconds_per_1000_steps": r.wall_per_1000_steps,
        "total_versions": r.total_versions,
        "foreign_received": r.foreign_received,
        "throttled": r.throttled,
        "run_seconds": r.run_seconds,
        "server_cpu_seconds": r.server_cpu_seconds,
        "participants": [asdict(p) for p in r.participants],
    }


def machine(cores: int) -> dict[str, Any]:
    """What the figures were measured on."""
    model = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text(encoding="utf-8").splitlines()
            if line.startswith("model name")
        ]
        model = names[0] if names else model
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": model,
        "cores_available": cores,
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def figures(
    comparisons: Sequence[Comparison],
    results: Sequence[RunResult],
    settings: Settings,
    *,
    seeds: Sequence[int],
    cores: int,
    load: tuple[float, float],
) -> dict[str, Any]:
    """Every figure, per group and per run: the bench's last line."""
    return {
        "env": settings.env,
        "target": settings.target,
        "seeds": list(seeds),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **commit(),
        "machine": machine(cores),
        "load_start": load[0],
        "load_end": load[1],
        "bootstrap": {
            "resamples": statistics.REPS,
            "seed": statistics.SEED,
            "confidence": statistics.CONFIDENCE,
        },
        "settings": {**asdict(settings), "hidden": list(settings.hidden)},
        "configurations": [comparison_figures(c) for c in comparisons],
        "runs": [run_figures(r) for r in results],
    }
