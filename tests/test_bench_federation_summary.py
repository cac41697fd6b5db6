"""bench.federation's figures over seeds: each group against its three references, the table and
the JSON line that report them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.federation.report import comparison_figures, figures, table_lines
from bench.federation.results import RunResult
from bench.federation.settings import Mode, Settings
from bench.federation.statistics import Estimate
from bench.federation.summary import Comparison, compare
from bench.federation.sweep import Measured, Reference
from tests.support.benches import make_run

LOW, HIGH = 0.0, 500.0


def solved_at(mark: int, marks: int = 10) -> list[float]:
    """Scores that reach the target at `mark` (of marks every 100 steps) and hold it."""
    first = mark // 100 - 1
    return [LOW] * first + [HIGH] * (marks - first)


def runs(mode: Mode, n: int, steps: list[int | None], **kwargs: Any) -> list[RunResult]:
    """One run per seed, solving at the steps given (None: never, in 10 marks)."""
    return [
        make_run(mode, n, seed, [LOW] * 10 if s is None else solved_at(s), **kwargs)
        for seed, s in enumerate(steps)
    ]


def reference(runs_: list[RunResult], horizon: int) -> Reference:
    achieved = sum(r.updates_per_step_at(horizon) for r in runs_) / len(runs_)
    return Reference(runs_[0].configuration, runs_, 1.0, achieved, horizon)


def measured(
    group: list[RunResult],
    default: list[RunResult],
    matched: list[RunResult],
    pooled: list[RunResult],
) -> Measured:
    horizon = min(group[0].budget, default[0].budget)
    return Measured(
        group=group[0].configuration,
        runs=group,
        default_lone=reference(default, horizon),
        compute_matched=reference(matched, horizon),
        pooled=reference(pooled, horizon),
    )


def comparison(
    n: int,
    rate: float,
    *,
    group: list[int | None],
    default: list[int | None],
    matched: list[int | None],
    pooled: list[int | None],
) -> Comparison:
    """A group of n making `rate` updates per step, its compute-matched references at twice
    the default replay ratio, every arrangement solving at the steps given per seed."""
    matching = {"replay_ratio": 2.0 * n, "updates_per_step": rate}
    return compare(
        measured(
            runs("both", n, group, updates_per_step=rate),
            runs("offline", 1, default),
            runs("offline", 1, matched, **matching),
            runs("pooled", n, pooled, **matching),
        )
    )


def test_a_group_is_measured_against_each_reference_its_headline_the_stronger_lone() -> None:
    # prepare: every seed of an arrangement solves at the same mark; the compute-matched
    # lone learner (600) beats the default one (800); the pool solves at 300, the pair at 200.
    # act
    c = comparison(2, 1.0, group=[200] * 5, default=[800] * 5, matched=[600] * 5, pooled=[300] * 5)

    # assert
    assert c.group.steps.value == 200
    assert (c.vs_default_lone.value, c.vs_compute_matched.value, c.vs_pooled.value) == (
        4.0,
        3.0,
        1.5,
    )
    assert c.headline == "compute-matched lone"
    assert c.headline_speedup == c.vs_compute_matched
    assert c.target_speedup == 1.6 and c.target_met
    assert c.lossless is None
    assert c.compute_matched.updates_per_step_at_horizon == pytest.approx(1.0)


def test_the_headline_is_the_default_lone_learner_where_it_is_the_stronger() -> None:
    c = comparison(4, 2.0, group=[200] * 3, default=[500] * 3, matched=[700] * 3, pooled=[400] * 3)

    assert c.headline == "default lone"
    assert c.headline_speedup.value == 2.5
    # The target (0.8 * 4 = 3.2) is held against the compute-matched learner: 3.5.
    assert c.vs_compute_matched.value == 3.5 and c.target_met


def test_unsolved_seeds_count_at_the_budget_and_a_wide_interval_is_no_measurable_gain() -> None:
    # prepare: the pair solves three seeds of five quickly and two never (counted at 1,000);
    # the matched lone learner solves every seed at 400-800.
    c = comparison(
        2,
        1.0,
        group=[200, 300, 200, None, None],
        default=[900] * 5,
        matched=[400, 800, 500, 700, 600],
        pooled=[300] * 5,
    )

    assert c.group.solved == 3
    assert c.group.per_seed_steps == [200, 300, 200, None, None]
    assert c.group.steps.value == pytest.approx((200 + 300 + 1_000) / 3)
    assert c.vs_compute_matched.low < 1.0 < c.vs_compute_matched.high
    assert c.vs_compute_matched.gain == "no measurable gain"
    assert not c.target_met
    lines = "\n".join(table_lines([c], Settings(budget_steps=1_000, eval_every=100), range(5), 2))
    assert "speed-up vs compute-matched lone:" in lines
    assert (
        "no measurable gain" in lines.split("speed-up vs compute-matched lone:")[1].split("\n")[0]
    )


def test_a_group_that_stops_sooner_than_its_lone_references_gains_nothing_by_stopping() -> None:
    # prepare: nobody solves; the pair runs 5 marks, the lone references 10.
    group = [make_run("both", 2, seed, [LOW] * 5, updates_per_step=1.0) for seed in range(3)]
    default = [make_run("offline", 1, seed, [LOW] * 10) for seed in range(3)]

    c = compare(measured(group, default, default, default))

    assert c.group.steps.value == 1_000
    assert c.vs_default_lone == Estimate(1.0, 1.0, 1.0)
    assert c.vs_default_lone.gain == "no measurable gain"


def test_a_lone_member_is_held_to_what_the_lone_learner_reached_within_its_budget() -> None:
    # prepare: the lone learner runs 10 marks and solves at 400 and 900; the member runs 5
    # marks (500 steps), solving at 400 and not at all, as the lone learner did by then.
    default = [make_run("offline", 1, 0, solved_at(400)), make_run("offline", 1, 1, solved_at(900))]
    member = [
        make_run("both", 1, 0, solved_at(400, marks=5)),
        make_run("both", 1, 1, [LOW] * 5),
    ]

    c = compare(measured(member, default, default, default))

    assert c.lossless is not None
    assert (c.lossless.solved, c.lossless.reference_solved) == (1, 1)
    assert c.lossless.steps_ratio.value == 1.0
    assert c.lossless.holds
    assert c.target_speedup is None and c.target_met is None


def test_the_json_line_holds_every_configurations_speedups_intervals_and_iqm_steps() -> None:
    c = comparison(2, 1.0, group=[200] * 3, default=[800] * 3, matched=[600] * 3, pooled=[300] * 3)
    run = make_run("both", 2, 0, solved_at(200))

    line = json.dumps(figures([c], [run], Settings(), seeds=[0, 1, 2], cores=2, load=(0.0, 0.0)))

    (parsed,) = json.loads(line)["configurations"]
    assert parsed == json.loads(json.dumps(comparison_figures(c)))
    assert parsed["speedup_vs_compute_matched"] == 3.0
    assert parsed["iqm_steps"] == 200
    assert parsed["ci95"]["speedup_vs_compute_matched"] == [3.0, 3.0]
    assert parsed["ci95"]["steps"] == [200, 200]
    assert parsed["references"]["compute_matched_lone"]["replay_ratio"] == 4.0
    assert parsed["references"]["compute_matched_lone"]["iqm_steps"] == 600
    assert parsed["references"]["pooled"]["matched"] is True
    assert parsed["gain"]["speedup_vs_pooled"] == "gain"
    assert parsed["per_seed_steps"] == [200, 200, 200]
    (run_line,) = json.loads(line)["runs"]
    assert (run_line["key"], run_line["steps_to_target"]) == ("dqn both N=2", 200)
