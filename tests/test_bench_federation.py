"""bench/federation.py's figures: when a target counts as reached, and the summaries over seeds.

The bench is a script, not a package module; it is loaded from its file, so
these tests check exactly the functions the bench prints its figures with.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.support.benches import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("federation.py", "fedrl_bench_federation")


def run(
    bench: ModuleType,
    mode: str,
    n: int,
    seed: int,
    returns: list[float],
    *,
    target: float = 475.0,
    updates: tuple[int, ...] = (),
    cpu: tuple[float, ...] = (),
    versions: list[int] | None = None,
    own_returns: list[float] | None = None,
) -> Any:
    """A RunResult with marks every 100 steps, one second and one CPU second per mark; the
    local model scored unless `versions` are given, participant 0's own scores = `returns`
    unless given."""
    marks = [100 * (i + 1) for i in range(len(returns))]
    participants = [
        bench.ParticipantReport(
            learns=True,
            env_steps=marks[-1],
            episodes=10,
            updates=updates[i] if updates else marks[-1] // 2,
            foreign_received=0,
            cpu_seconds=cpu[i] if cpu else float(len(marks)),
            mark_ms=[1000 * (k + 1) for k in range(len(marks))],
            mark_cpu=[float(k + 1) for k in range(len(marks))],
        )
        for i in range(n)
    ]
    return bench.RunResult(
        configuration=bench.Configuration(n=n, mode=mode),
        seed=seed,
        marks=marks,
        returns=returns,
        seconds=[float(k + 1) for k in range(len(marks))],
        versions=[-1] * len(marks) if versions is None else versions,
        own_returns=returns if own_returns is None else own_returns,
        initial_return=9.0,
        participants=participants,
        total_versions=0,
        run_seconds=float(len(marks)),
        server_cpu_seconds=0.0,
        target=target,
    )


def test_a_target_counts_as_reached_at_the_first_of_two_consecutive_marks(
    bench: ModuleType,
) -> None:
    # A lone lucky mark (index 1) does not count; 3 and 4 in a row do.
    returns = [10.0, 480.0, 300.0, 475.0, 500.0, 200.0]

    assert bench.reached_at(returns, 475.0) == 3
    assert bench.reached_at(returns, 475.0, consecutive=1) == 1


def test_a_target_never_held_twice_in_a_row_is_not_reached(bench: ModuleType) -> None:
    assert bench.reached_at([480.0, 100.0, 480.0, 100.0, 480.0], 475.0) is None
    assert bench.reached_at([], 475.0) is None


def test_reached_needs_at_least_one_mark(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="consecutive"):
        bench.reached_at([500.0], 475.0, consecutive=0)


def test_a_run_reports_steps_seconds_and_cpu_at_the_reached_mark(bench: ModuleType) -> None:
    result = run(bench, "both", 2, 0, [10.0, 480.0, 300.0, 475.0, 500.0])

    assert result.steps_to_target == 400
    assert result.first_mark_at_target == 200
    assert result.seconds_to_target == 4.0
    assert result.cpu_to_target == 4.0


def test_the_median_counts_unsolved_seeds_as_infinity(bench: ModuleType) -> None:
    assert bench.median_or_none([1000, None, 3000]) == 3000
    assert bench.median_or_none([1000, None, None]) is None
    assert bench.median_or_none([1000, 2000, None, None]) is None
    assert bench.median_or_none([]) is None


def test_ratio_is_none_where_a_side_is_missing(bench: ModuleType) -> None:
    assert bench.ratio(3000.0, 1500.0) == 2.0
    assert bench.ratio(None, 1500.0) is None
    assert bench.ratio(3000.0, None) is None
    assert bench.ratio(3000.0, 0.0) is None


def test_speedup_is_offline_median_over_this_median_with_what_participants_spent(
    bench: ModuleType,
) -> None:
    # prepare: offline reaches the target at 400 and 600 steps (median 500); the
    # pair at 200 on both seeds, doing twice the updates per own env step.
    low, high = 0.0, 500.0
    results = [
        run(bench, "offline", 1, 0, [low, low, low, high, high, high]),
        run(bench, "offline", 1, 1, [low, low, low, low, low, high, high]),
        run(bench, "both", 2, 0, [low, high, high, low], updates=(400, 400), cpu=(3.0, 5.0)),
        run(bench, "both", 2, 1, [low, high, high, high], updates=(400, 400), cpu=(3.0, 5.0)),
    ]

    # act
    summaries = {s.configuration.key: s for s in bench.summarise(results, cores=2)}

    # assert
    offline, pair = summaries["dqn offline N=1"], summaries["dqn both N=2"]
    assert (offline.solved, offline.steps, offline.speedup) == (2, 500.0, 1.0)
    assert (pair.solved, pair.steps, pair.speedup) == (2, 200.0, 2.5)
    assert pair.updates_per_step == 1.0
    assert pair.cpu_seconds == 4.0
    assert pair.cpu_to_target == 2.0
    assert pair.own_cores
    assert pair.wall_speedup == pytest.approx(5.0 / 2.0)
    assert pair.per_seed_steps == [200, 200]


def test_a_target_reached_by_one_version_scored_twice_is_told_apart(bench: ModuleType) -> None:
    high = 500.0
    once = run(bench, "both", 2, 0, [10.0, high, high, 10.0], versions=[0, 3, 3, 4])
    twice = run(bench, "both", 2, 1, [10.0, high, high, 10.0], versions=[0, 3, 4, 4])
    alone = run(bench, "offline", 1, 0, [10.0, high, high, 10.0])

    assert [r.steps_to_target for r in (once, twice, alone)] == [200, 200, 200]
    assert [r.reached_on_one_version for r in (once, twice, alone)] == [True, False, False]
    assert bench.summarise([once, twice], cores=2)[0].one_version == 1


def test_participant_zeros_own_model_gets_its_own_steps_and_speedup(bench: ModuleType) -> None:
    low, high = 0.0, 500.0
    results = [
        run(bench, "offline", 1, 0, [low, low, low, high, high]),
        run(
            bench,
            "both",
            2,
            0,
            [low, high, high, low, low],
            versions=[0, 1, 1, 2, 3],
            own_returns=[low, low, high, high, low],
        ),
    ]

    summaries = {s.configuration.key: s for s in bench.summarise(results, cores=2)}

    pair = summaries["dqn both N=2"]
    assert (pair.steps, pair.speedup) == (200.0, 2.0)
    assert (pair.own_solved, pair.own_steps, pair.own_speedup) == (1, 300.0, 4 / 3)
    assert pair.own_steps_vs_reference == pytest.approx(0.75)
    assert pair.own_per_seed_steps == [300]
    assert summaries["dqn offline N=1"].own_steps == 400.0


def test_no_speedup_when_the_median_seed_is_unsolved(bench: ModuleType) -> None:
    results = [
        run(bench, "offline", 1, 0, [0.0, 500.0, 500.0]),
        run(bench, "weights", 1, 0, [0.0, 0.0, 0.0]),
    ]

    summaries = {s.configuration.key: s for s in bench.summarise(results, cores=2)}

    weights = summaries["dqn weights N=1"]
    assert (weights.solved, weights.steps, weights.speedup) == (0, None, None)
    assert weights.steps_vs_reference is None
    assert weights.reference_solved == 1


def test_a_lone_federated_participant_is_compared_with_offline(bench: ModuleType) -> None:
    results = [
        run(bench, "offline", 1, 0, [0.0, 0.0, 0.0, 0.0, 500.0, 500.0]),
        run(bench, "both", 1, 0, [0.0, 0.0, 0.0, 0.0, 0.0, 500.0, 500.0]),
    ]

    both = {s.configuration.key: s for s in bench.summarise(results, cores=2)}["dqn both N=1"]

    assert both.steps_vs_reference == pytest.approx(600 / 500)


def test_a_lone_participant_is_held_to_what_offline_reached_within_its_own_budget(
    bench: ModuleType,
) -> None:
    # prepare: offline runs 8 marks and reaches 475 on seed 0 at 200 steps, on seed 1 only
    # at 600; the lone participant runs 4 marks, as the groups do, and matches it.
    results = [
        run(bench, "offline", 1, 0, [0.0, 500.0, 500.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        run(bench, "offline", 1, 1, [0.0] * 5 + [500.0] * 3),
        run(bench, "both", 1, 0, [0.0, 500.0, 500.0, 0.0]),
        run(bench, "both", 1, 1, [0.0] * 4),
        run(bench, "both", 2, 0, [500.0] * 4),
        run(bench, "both", 2, 1, [500.0] * 4),
    ]

    # act
    summaries = {s.configuration.key: s for s in bench.summarise(results, cores=2)}

    # assert: within 400 steps offline solved 1 of 2, as the lone participant did; the
    # pair is measured against offline's whole runs (median 400).
    alone, pair = summaries["dqn both N=1"], summaries["dqn both N=2"]
    assert (alone.solved, alone.reference_solved) == (1, 1)
    assert alone.steps is None and alone.speedup is None
    assert summaries["dqn offline N=1"].solved == 2
    assert (pair.reference_solved, pair.speedup) == (2, 4.0)


def test_wall_clock_is_compared_only_where_each_participant_had_a_core(
    bench: ModuleType,
) -> None:
    results = [
        run(bench, "offline", 1, 0, [0.0, 500.0, 500.0]),
        run(bench, "both", 4, 0, [500.0, 500.0, 500.0]),
    ]

    four = {s.configuration.key: s for s in bench.summarise(results, cores=2)}["dqn both N=4"]

    assert not four.own_cores
    assert four.seconds is None and four.wall_speedup is None
    assert four.speedup == 2.0


def test_the_mean_score_covers_every_mark_of_every_seed(bench: ModuleType) -> None:
    results = [
        run(bench, "offline", 1, 0, [0.0, 100.0]),
        run(bench, "offline", 1, 1, [200.0, 300.0]),
    ]

    (offline,) = bench.summarise(results, cores=2)

    assert offline.mean_return == 150.0
    assert bench.median_curve(results) == [100.0, 200.0]


def test_the_sweep_always_runs_the_offline_reference_and_every_mode_at_one(
    bench: ModuleType,
) -> None:
    keys = [c.key for c in bench.sweep([2, 4], ["both", "roles"], ["dqn"])]

    assert keys == [
        "dqn offline N=1",
        "dqn both N=1",
        "dqn both N=2",
        "dqn both N=4",
        "dqn roles N=1",
        "dqn roles N=2",
        "dqn roles N=4",
    ]


def test_a_sweep_without_the_lone_check_runs_the_reference_and_the_groups(
    bench: ModuleType,
) -> None:
    keys = [c.key for c in bench.sweep([1, 2, 4], ["both"], ["dqn"], lone=False)]

    assert keys == ["dqn offline N=1", "dqn both N=2", "dqn both N=4"]


def test_no_lone_with_only_lone_counts_is_refused(bench: ModuleType) -> None:
    with pytest.raises(SystemExit, match="--no-lone leaves nothing to run"):
        bench.main(["--no-lone", "--n", "1"])


def test_ppo_runs_only_the_modes_it_supports(bench: ModuleType) -> None:
    keys = [c.key for c in bench.sweep([2], list(bench.MODES), ["ppo"])]

    assert keys == ["ppo offline N=1", "ppo weights N=1", "ppo weights N=2", "ppo pooled N=2"]


def test_pooled_runs_only_for_groups_since_at_one_it_is_offline(bench: ModuleType) -> None:
    keys = [c.key for c in bench.sweep([2, 4], ["pooled"], ["dqn"])]

    assert keys == ["dqn offline N=1", "dqn pooled N=2", "dqn pooled N=4"]


def test_a_pooled_learner_takes_n_participants_envs_budget_and_marks(bench: ModuleType) -> None:
    settings = bench.Settings(budget_steps=1_000, eval_every=250)

    pooled = settings.pooled(4)

    assert (pooled.envs_per_participant, pooled.budget_steps, pooled.eval_every) == (
        4 * settings.envs_per_participant,
        4_000,
        1_000,
    )
    assert pooled.marks == [4 * mark for mark in settings.marks]
    assert bench.Configuration(4, "pooled").processes == 1
    assert bench.Configuration(4, "both").processes == 4


def test_a_pooled_learner_gets_the_target_period_of_a_member_of_its_group(
    bench: ModuleType,
) -> None:
    lone = bench.Settings()
    fixed = bench.Settings(learner=(("target_period_data_exponent", "0"),))

    def period(settings: Any) -> int:
        return int(bench.learner_config(settings, "dqn").target_update_interval)

    assert period(lone) == bench.LearnerConfig().target_update_interval == 500
    assert period(lone.pooled(4)) == 1_000
    assert period(lone.pooled(2)) == 707
    assert period(fixed.pooled(4)) == 500


def test_a_pooled_learners_updates_and_cpu_count_per_participant(bench: ModuleType) -> None:
    # prepare: one process took 4 x 600 steps with 1,200 updates and 8 CPU seconds,
    # reaching the target at the fourth of six marks (4 CPU s by then).
    result = run(bench, "pooled", 4, 0, [0.0, 0.0, 0.0, 480.0, 490.0, 0.0], cpu=(8.0,) * 4)
    pooled = dataclasses.replace(
        result,
        participants=[dataclasses.replace(result.participants[0], env_steps=2_400, updates=1_200)],
    )

    # act
    summary = bench.summarise([pooled], cores=4)[0]

    # assert
    assert pooled.steps_to_target == 400
    assert pooled.updates_per_step == 2.0
    assert pooled.cpu_seconds == 2.0
    assert pooled.cpu_to_target == 1.0
    assert not summary.own_cores


def test_a_pooled_run_trains_one_learner_on_n_times_the_steps(
    bench: ModuleType, tmp_path: Path
) -> None:
    settings = bench.Settings(budget_steps=400, eval_every=200, eval_episodes=2)

    result = bench.run_configuration(bench.Configuration(2, "pooled"), 0, settings, tmp_path)

    (learner,) = result.participants
    assert learner.env_steps >= 800
    assert result.marks == [200, 400]
    assert len(result.returns) == len(result.own_returns) == 2
    assert result.returns == result.own_returns
    assert result.versions == [-1, -1]


def test_tasks_come_with_their_target_budget_and_marks(bench: ModuleType) -> None:
    lunar = bench.resolve_task(bench.TASKS["lunarlander"])
    custom = bench.resolve_task(bench.TASKS["cartpole"], budget=2_000, eval_every=500, target=200.0)

    assert (lunar.env, lunar.target, lunar.budget_steps, lunar.eval_every) == (
        "LunarLander-v3",
        100.0,
        120_000,
        4_000,
    )
    assert (custom.env, custom.target, custom.budget_steps) == ("CartPole-v1", 200.0, 2_000)
    assert bench.resolve_task(bench.TASKS["cartpole"], env="LunarLander-v3") == lunar
    settings = bench.Settings(budget_steps=custom.budget_steps, eval_every=custom.eval_every)
    assert settings.marks == [500, 1000, 1500, 2000]


def test_an_unknown_env_needs_a_target(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="--target is needed for Acrobot-v1"):
        bench.resolve_task(bench.TASKS["cartpole"], env="Acrobot-v1")

    acrobot = bench.resolve_task(bench.TASKS["cartpole"], env="Acrobot-v1", target=-100.0)

    assert (acrobot.env, acrobot.target) == ("Acrobot-v1", -100.0)


def test_marks_must_fit_in_the_budget(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="--eval-every"):
        bench.resolve_task(bench.TASKS["cartpole"], budget=1_000, eval_every=2_000)


def test_learner_fields_change_from_text_and_anything_else_is_refused(bench: ModuleType) -> None:
    base = bench.LearnerConfig()
    changed = bench.learner_overrides(
        base, [("lr", "5e-4"), ("target_update_interval", "1000"), ("dueling", "false")]
    )
    assert (changed.lr, changed.target_update_interval, changed.dueling) == (5e-4, 1000, False)
    assert changed.batch_size == base.batch_size
    for changes, message in (
        ([("learning_rate", "1")], "no field 'learning_rate'"),
        ([("lr", "fast")], "lr takes a float"),
        ([("dueling", "yes")], "dueling takes true or false"),
        ([("hidden", "64")], "hidden is not a number"),
    ):
        with pytest.raises(ValueError, match=message):
            bench.learner_overrides(base, changes)


def test_learner_options_reach_every_participants_learner_and_bad_ones_stop_the_bench(
    bench: ModuleType,
) -> None:
    settings = bench.settings_from(
        bench.parse_args(["--learner", "target_period_data_exponent=0", "lr=5e-4"])
    )
    # A participant process rebuilds its settings from JSON.
    received = bench.settings_from_json(json.loads(json.dumps(dataclasses.asdict(settings))))
    rebuilt = bench.learner_config(received, "dqn")

    assert received == settings
    assert (rebuilt.target_period_data_exponent, rebuilt.lr) == (0.0, 5e-4)
    assert rebuilt.hidden == bench.learner_config(bench.Settings(), "dqn").hidden
    for argv, message in (
        (["--learner", "lr"], "--learner takes NAME=VALUE"),
        (["--learner", "gamma=high"], "gamma takes a float"),
        (["--learner", "lr=1e-3", "--algo", "ppo"], "changes the DQN learner"),
    ):
        with pytest.raises(SystemExit, match=message):
            bench.settings_from(bench.parse_args(argv))


def test_the_pull_cap_reaches_the_settings_and_a_cap_below_one_stops_the_bench(
    bench: ModuleType,
) -> None:
    settings = bench.settings_from(bench.parse_args(["--pull-transitions", "16384"]))

    assert settings.pull_transitions == 16_384
    assert bench.Settings().pull_transitions == bench.ExchangeConfig().pull_transitions
    with pytest.raises(SystemExit, match="pull_transitions"):
        bench.settings_from(bench.parse_args(["--pull-transitions", "0"]))


def test_synchronous_rounds_reach_the_settings_and_need_sync_steps(bench: ModuleType) -> None:
    settings = bench.settings_from(bench.parse_args(["--round-wait-s", "2", "--sync-steps", "64"]))

    assert (settings.round_wait_s, settings.sync_steps) == (2.0, 64)
    # Left out, they are the client's: 5 s from three members on, rounds of 128 env steps.
    assert (bench.Settings().round_wait_s, bench.Settings().sync_steps) == (None, None)
    with pytest.raises(ValueError, match="--sync-steps"):
        bench.settings_from(bench.parse_args(["--round-wait-s", "5", "--sync-steps", "0"]))
    with pytest.raises(ValueError, match="for DQN"):
        bench.settings_from(
            bench.parse_args(["--round-wait-s", "5", "--sync-steps", "128", "--algo", "dqn", "ppo"])
        )


def test_the_offline_reference_may_run_a_budget_of_its_own(bench: ModuleType) -> None:
    settings = bench.settings_from(
        bench.parse_args(["--budget", "2000", "--offline-budget", "6000"])
    )

    assert settings.of("offline").budget_steps == 6_000
    assert settings.of("offline").marks[-1] == 6_000
    assert settings.of("both").budget_steps == settings.of("pooled").budget_steps == 2_000
    assert settings.of("pooled").pooled(2).budget_steps == 4_000
    assert bench.Settings().of("offline") == bench.Settings()
    with pytest.raises(SystemExit, match="at least one mark"):
        bench.settings_from(bench.parse_args(["--offline-budget", "100"]))


def test_a_longer_offline_reference_sets_the_speedup_and_scores_over_the_shared_marks(
    bench: ModuleType,
) -> None:
    # prepare: offline reaches 475 at its 8th mark of 10 (800 steps), beyond the pair's
    # 4 marks; the pair reaches it at its 2nd (200 steps).
    offline = run(bench, "offline", 1, 0, [100.0] * 7 + [480.0, 490.0, 500.0])
    pair = run(bench, "both", 2, 0, [100.0, 480.0, 490.0, 500.0])

    # act
    summaries = {s.configuration.key: s for s in bench.summarise([offline, pair], cores=2)}

    # assert
    assert summaries["dqn offline N=1"].steps == 800
    assert summaries["dqn both N=2"].speedup == 4.0
    assert summaries["dqn offline N=1"].mean_return == 100.0
    assert summaries["dqn both N=2"].mean_return == (100.0 + 480.0 + 490.0 + 500.0) / 4


def test_a_group_meets_the_target_at_offlines_median_over_point_eight_n(
    bench: ModuleType,
) -> None:
    # prepare: offline's median is 1,600 steps, so a pair's target is 1,000 steps each;
    # one pair reaches 475 at 1,000 (met), another at 1,100 (missed), 11 marks each.
    low, high = 0.0, 500.0
    offline = run(bench, "offline", 1, 0, [low] * 15 + [high, high])
    met = run(bench, "both", 2, 0, [low] * 9 + [high, high])
    missed = run(bench, "both", 4, 0, [low] * 10 + [high, high])

    # act
    summaries = {s.configuration.key: s for s in bench.summarise([offline, met, missed], 2)}

    # assert
    pair, four = summaries["dqn both N=2"], summaries["dqn both N=4"]
    assert (pair.target_steps, pair.verdict, pair.own_verdict) == (1000.0, "met", "met")
    assert (four.target_steps, four.verdict) == (500.0, "missed")
    assert summaries["dqn offline N=1"].verdict is None
    assert (
        bench.verdict_line(pair) == "target 1,000 steps each: global met; participant 0's own met"
    )


def test_an_unsolved_median_within_a_budget_short_of_the_target_decides_nothing(
    bench: ModuleType,
) -> None:
    # prepare: offline's median is 1,600 steps, so the target is 1,000 steps each for a
    # pair and 500 for a four. A pair's run of 900 steps cannot show a seed reached at
    # 1,000 (confirmed at 1,100); a four's of 600 steps can show one reached at 500.
    offline = run(bench, "offline", 1, 0, [0.0] * 15 + [500.0, 500.0])
    short = run(bench, "both", 2, 0, [0.0] * 9)
    long_enough = run(bench, "both", 4, 0, [0.0] * 6)

    # act
    summaries = {s.configuration.key: s for s in bench.summarise([offline, short, long_enough], 2)}

    # assert
    pair, four = summaries["dqn both N=2"], summaries["dqn both N=4"]
    assert (pair.budget, pair.mark_every, pair.verdict) == (900, 100, "undecided")
    assert "run with --budget 1100" in bench.verdict_line(pair)
    assert bench.target_verdict(None, 1000.0, 1_100, 100) == "missed"
    assert four.verdict == "missed"


def test_an_offline_run_of_its_own_budget_is_scored_at_its_own_marks(
    bench: ModuleType, tmp_path: Path
) -> None:
    settings = bench.Settings(
        budget_steps=200, offline_budget_steps=400, eval_every=200, eval_episodes=2
    )

    result = bench.run_configuration(bench.Configuration(1, "offline"), 0, settings, tmp_path)

    assert result.marks == [200, 400]
    assert len(result.returns) == 2
    assert result.participants[0].env_steps >= 400


def test_the_offline_reference_starts_from_version_zero_of_the_same_seed(
    bench: ModuleType,
) -> None:
    settings = bench.Settings()

    first = bench.initial_weights(settings, 3, "dqn")
    again = bench.initial_weights(settings, 3, "dqn")
    other = bench.initial_weights(settings, 4, "dqn")

    for (name, a), (_, b) in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert not all(np.array_equal(a, b) for (_, a), (_, b) in zip(first, other, strict=True))


def test_a_paced_actor_waits_until_the_learner_has_taken_as_many_env_steps(
    bench: ModuleType, tmp_path: Path
) -> None:
    pace = bench.StepPace(tmp_path / "learner_steps")
    released: list[threading.Event] = [threading.Event(), threading.Event()]

    def actor() -> None:
        pace.wait_until_behind(0)  # nothing posted yet: the learner has not started
        released[0].set()
        pace.wait_until_behind(256)
        released[1].set()

    thread = threading.Thread(target=actor, daemon=True)
    thread.start()
    assert not released[0].wait(0.1)
    pace.post(0)
    assert released[0].wait(5.0)
    pace.post(128)
    assert not released[1].wait(0.2)
    pace.post(300)
    assert released[1].wait(5.0)
    thread.join(5.0)


def test_roles_actors_follow_the_learner_and_even_pace_has_everyone_follow_the_rest(
    bench: ModuleType,
) -> None:
    free = bench.settings_from(bench.parse_args([]))
    even = bench.settings_from(bench.parse_args(["--even-pace"]))
    both = bench.Configuration(n=3, mode="both")
    roles = bench.Configuration(n=3, mode="roles")

    assert not free.even_pace and even.even_pace
    assert [bench.paced_by(both, free, index) for index in range(3)] == [[], [], []]
    assert [bench.paced_by(roles, free, index) for index in range(3)] == [[], [0], [0]]
    assert [bench.paced_by(both, even, index) for index in range(3)] == [[1, 2], [0, 2], [0, 1]]
    assert bench.paced_by(bench.Configuration(n=2, mode="pooled"), even, 0) == []


def test_envs_per_participant_reach_the_settings_and_fewer_than_one_stop_the_bench(
    bench: ModuleType,
) -> None:
    settings = bench.settings_from(bench.parse_args(["--envs-per-participant", "64"]))

    assert settings.envs_per_participant == 64
    with pytest.raises(SystemExit, match="--envs-per-participant must be at least 1"):
        bench.settings_from(bench.parse_args(["--envs-per-participant", "0"]))
