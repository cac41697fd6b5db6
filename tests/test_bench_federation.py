"""bench.federation's runs and settings: when a target counts as reached, the figures of one run,
the configurations an invocation sweeps, and the options that reach every participant."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from bench.federation import cli, participant, runner
from bench.federation.participant import StepPace, paced_by
from bench.federation.results import cut, updates_per_step_at
from bench.federation.scoring import reached_at
from bench.federation.settings import (
    GROUP_MODES,
    TASKS,
    Configuration,
    Settings,
    group_configurations,
    learner_overrides,
    resolve_task,
    settings_from_json,
)
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.common.group_rules_serde import choices_to_proto, rules_from_proto
from tests.support.benches import make_run
from tests.support.server_harness import InProcessServer, join, server_config


def test_a_target_counts_as_reached_at_the_first_of_two_consecutive_marks() -> None:
    # A lone lucky mark (index 1) does not count; 3 and 4 in a row do.
    returns = [10.0, 480.0, 300.0, 475.0, 500.0, 200.0]

    assert reached_at(returns, 475.0) == 3
    assert reached_at(returns, 475.0, consecutive=1) == 1


def test_a_target_never_held_twice_in_a_row_is_not_reached() -> None:
    assert reached_at([480.0, 100.0, 480.0, 100.0, 480.0], 475.0) is None
    assert reached_at([], 475.0) is None


def test_reached_needs_at_least_one_mark() -> None:
    with pytest.raises(ValueError, match="consecutive"):
        reached_at([500.0], 475.0, consecutive=0)


def test_a_run_reports_steps_seconds_and_cpu_at_the_reached_mark() -> None:
    result = make_run("both", 2, 0, [10.0, 480.0, 300.0, 475.0, 500.0])

    assert result.steps_to_target == result.steps_or_budget == 400
    assert result.first_mark_at_target == 200
    assert result.seconds_to_target == result.seconds_or_budget == 4.0
    assert result.cpu_to_target == result.cpu_or_budget == 4.0


def test_an_unsolved_run_counts_at_its_budget_and_last_mark() -> None:
    result = make_run("both", 2, 0, [10.0, 480.0, 300.0, 100.0])

    assert result.steps_to_target is None
    assert result.steps_or_budget == result.budget == 400
    assert (result.seconds_or_budget, result.cpu_or_budget) == (4.0, 4.0)


def test_updates_per_step_count_every_process_to_a_mark() -> None:
    # prepare: two participants, 600 and 0 updates over 4 marks of 100 steps (an actor's 0).
    result = make_run("roles", 2, 0, [0.0] * 4, updates=(600, 0))

    assert result.updates_per_step == pytest.approx(600 / 800)
    assert result.updates_per_step_at(200) == pytest.approx(300 / 400)
    assert updates_per_step_at([result, result], 400) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="250 is not a mark"):
        result.updates_per_step_at(250)


def test_cpu_and_wall_per_1000_steps_are_per_participant() -> None:
    result = make_run("both", 2, 0, [0.0] * 4, cpu=(2.0, 6.0))

    assert result.cpu_per_1000_steps == pytest.approx(1_000 * 4.0 / 400)
    assert result.wall_per_1000_steps == pytest.approx(1_000 * 4.0 / 400)


def test_a_target_reached_by_one_version_scored_twice_is_told_apart() -> None:
    high = 500.0
    once = make_run("both", 2, 0, [10.0, high, high, 10.0], versions=[0, 3, 3, 4])
    twice = make_run("both", 2, 1, [10.0, high, high, 10.0], versions=[0, 3, 4, 4])
    alone = make_run("offline", 1, 0, [10.0, high, high, 10.0])

    assert [r.steps_to_target for r in (once, twice, alone)] == [200, 200, 200]
    assert [r.reached_on_one_version for r in (once, twice, alone)] == [True, False, False]


def test_the_mean_score_covers_the_marks_up_to_the_horizon() -> None:
    result = make_run("offline", 1, 0, [0.0, 100.0, 200.0, 300.0])

    assert result.mean_score(400) == 150.0
    assert result.mean_score(200) == 50.0
    with pytest.raises(ValueError, match="no mark up to 50"):
        result.mean_score(50)


def test_a_run_cut_to_a_budget_keeps_its_marks_up_to_it() -> None:
    result = make_run("offline", 1, 0, [0.0, 500.0, 0.0, 500.0, 500.0])

    kept = cut(result, 300)

    assert kept.marks == [100, 200, 300]
    assert kept.steps_to_target is None and kept.steps_or_budget == 300
    assert result.steps_to_target == 400


def test_a_pooled_learners_steps_updates_cpu_and_wall_count_per_participant() -> None:
    # prepare: one process took 4 x 600 steps with 1,200 updates and 8 CPU seconds,
    # reaching the target at the fourth of six marks (4 CPU s by then).
    pooled = make_run("pooled", 4, 0, [0.0, 0.0, 0.0, 480.0, 490.0, 0.0], cpu=(8.0,))
    pooled = dataclasses.replace(
        pooled,
        participants=[dataclasses.replace(pooled.participants[0], updates=1_200)],
    )

    assert pooled.participants[0].env_steps == 2_400
    assert pooled.steps_to_target == 400
    assert pooled.updates_per_step == 0.5
    assert pooled.cpu_seconds == 2.0
    assert pooled.cpu_to_target == 1.0
    assert pooled.seconds_to_target == 1.0
    assert pooled.steps_per_participant == 600


def test_every_group_mode_runs_at_every_n_and_at_one() -> None:
    keys = [c.key for c in group_configurations([2, 4], ["both", "roles"], ["dqn"])]

    assert keys == [
        "dqn both N=1",
        "dqn both N=2",
        "dqn both N=4",
        "dqn roles N=1",
        "dqn roles N=2",
        "dqn roles N=4",
    ]


def test_without_the_lone_check_only_the_groups_run() -> None:
    keys = [c.key for c in group_configurations([1, 2, 4], ["both"], ["dqn"], lone=False)]

    assert keys == ["dqn both N=2", "dqn both N=4"]


def test_ppo_runs_only_the_modes_it_supports() -> None:
    keys = [c.key for c in group_configurations([2], list(GROUP_MODES), ["ppo"])]

    assert keys == ["ppo weights N=1", "ppo weights N=2"]


def test_a_configurations_replay_ratio_is_part_of_its_key() -> None:
    assert Configuration(1, "offline").key == "dqn offline N=1"
    assert Configuration(2, "pooled", replay_ratio=1.23456).key == "dqn pooled N=2 rr=1.235"


def test_no_lone_with_only_lone_counts_is_refused() -> None:
    with pytest.raises(SystemExit, match="--no-lone leaves nothing to run"):
        cli.main(["--no-lone", "--n", "1"])


def test_seeds_default_to_the_tasks_count_and_must_be_distinct() -> None:
    assert cli.seeds_from(cli.parse_args([])) == list(range(10))
    assert cli.seeds_from(cli.parse_args(["--task", "lunarlander"])) == list(range(5))
    assert cli.seeds_from(cli.parse_args(["--quick"])) == [0, 1]
    assert cli.seeds_from(cli.parse_args(["--seeds", "7", "3"])) == [7, 3]
    with pytest.raises(SystemExit, match="--seeds must be distinct"):
        cli.seeds_from(cli.parse_args(["--seeds", "1", "1"]))


def test_the_quick_run_is_one_mode_at_one_and_two() -> None:
    keys = [c.key for c in cli.groups_from(cli.parse_args(["--quick"]))]

    assert keys == ["dqn both N=1", "dqn both N=2"]
    with pytest.raises(SystemExit, match="at least 1"):
        cli.groups_from(cli.parse_args(["--n", "0"]))


def test_a_pooled_learner_takes_n_participants_envs_budget_and_marks() -> None:
    settings = Settings(budget_steps=1_000, eval_every=250)

    pooled = settings.pooled(4)

    assert (pooled.envs_per_participant, pooled.budget_steps, pooled.eval_every) == (
        4 * settings.envs_per_participant,
        4_000,
        1_000,
    )
    assert pooled.marks == [4 * mark for mark in settings.marks]
    assert Configuration(4, "pooled").processes == 1
    assert Configuration(4, "both").processes == 4


def test_a_pooled_learner_gets_the_target_period_of_a_member_of_its_group() -> None:
    lone = Settings()
    fixed = Settings(learner=(("target_period_data_exponent", "0"),))

    def period(settings: Settings) -> int:
        return int(participant.learner_config(settings, "dqn").target_update_interval)

    assert period(lone) == LearnerConfig().target_update_interval == 500
    assert period(lone.pooled(4)) == 1_000
    assert period(lone.pooled(2)) == 707
    assert period(fixed.pooled(4)) == 500


def test_a_replay_ratio_reaches_the_engine_and_none_keeps_its_default() -> None:
    engine, _ = participant.engine_configs(Settings(), 0, "dqn", replay_ratio=1.7)
    default, _ = participant.engine_configs(Settings(), 0, "dqn")

    assert engine.replay_ratio == 1.7
    assert default.replay_ratio == participant.DEFAULT_REPLAY_RATIO


def test_a_participant_task_survives_its_trip_through_json(tmp_path: Path) -> None:
    task = participant.ParticipantTask(
        index=1,
        participant_id="p1",
        address="127.0.0.1:1",
        state_dir=str(tmp_path),
        result_path=str(tmp_path / "p1.json"),
        seed=3,
        mode="pooled",
        settings=Settings(learner=(("lr", "5e-4"),)).pooled(2),
        replay_ratio=1.25,
        pace_follow=("a", "b"),
    )

    assert participant.task_from_json(json.loads(json.dumps(dataclasses.asdict(task)))) == task


def test_tasks_come_with_their_target_budget_marks_and_seeds() -> None:
    lunar = resolve_task(TASKS["lunarlander"])
    custom = resolve_task(TASKS["cartpole"], budget=2_000, eval_every=500, target=200.0)

    assert (lunar.env, lunar.target, lunar.budget_steps, lunar.eval_every, lunar.seeds) == (
        "LunarLander-v3",
        100.0,
        120_000,
        4_000,
        5,
    )
    assert TASKS["cartpole"].seeds == 10
    assert (custom.env, custom.target, custom.budget_steps) == ("CartPole-v1", 200.0, 2_000)
    assert resolve_task(TASKS["cartpole"], env="LunarLander-v3") == lunar
    settings = Settings(budget_steps=custom.budget_steps, eval_every=custom.eval_every)
    assert settings.marks == [500, 1000, 1500, 2000]


def test_an_unknown_env_needs_a_target() -> None:
    with pytest.raises(ValueError, match="--target is needed for Acrobot-v1"):
        resolve_task(TASKS["cartpole"], env="Acrobot-v1")

    acrobot = resolve_task(TASKS["cartpole"], env="Acrobot-v1", target=-100.0)

    assert (acrobot.env, acrobot.target) == ("Acrobot-v1", -100.0)


def test_marks_must_fit_in_the_budget() -> None:
    with pytest.raises(ValueError, match="--eval-every"):
        resolve_task(TASKS["cartpole"], budget=1_000, eval_every=2_000)


def test_learner_fields_change_from_text_and_anything_else_is_refused() -> None:
    base = LearnerConfig()
    changed = learner_overrides(
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
            learner_overrides(base, changes)


def test_learner_options_reach_every_participants_learner_and_bad_ones_stop_the_bench() -> None:
    settings = cli.settings_from(
        cli.parse_args(["--learner", "target_period_data_exponent=0", "lr=5e-4"])
    )
    # A participant process rebuilds its settings from JSON.
    received = settings_from_json(json.loads(json.dumps(dataclasses.asdict(settings))))
    rebuilt = participant.learner_config(received, "dqn")

    assert received == settings
    assert isinstance(rebuilt, LearnerConfig)
    assert (rebuilt.target_period_data_exponent, rebuilt.lr) == (0.0, 5e-4)
    assert rebuilt.hidden == LearnerConfig(hidden=Settings().hidden).hidden
    for argv, message in (
        (["--learner", "lr"], "--learner takes NAME=VALUE"),
        (["--learner", "gamma=high"], "gamma takes a float"),
        (["--learner", "lr=1e-3", "--algo", "ppo"], "changes the DQN learner"),
    ):
        with pytest.raises(SystemExit, match=message):
            cli.settings_from(cli.parse_args(argv))


def test_the_pull_cap_reaches_the_settings_and_a_cap_below_one_stops_the_bench() -> None:
    settings = cli.settings_from(cli.parse_args(["--pull-transitions", "16384"]))

    assert settings.pull_transitions == 16_384
    assert Settings().pull_transitions == ExchangeConfig().pull_transitions
    with pytest.raises(SystemExit, match="pull_transitions"):
        cli.settings_from(cli.parse_args(["--pull-transitions", "0"]))


def test_synchronous_rounds_reach_the_settings_and_need_sync_steps() -> None:
    settings = cli.settings_from(cli.parse_args(["--round-wait-s", "2", "--sync-steps", "64"]))

    assert (settings.round_wait_s, settings.sync_steps) == (2.0, 64)
    # Left out, they are the client's: 5 s from two members on, rounds of 128 env steps.
    assert (Settings().round_wait_s, Settings().sync_steps) == (None, None)
    with pytest.raises(ValueError, match="--sync-steps"):
        cli.settings_from(cli.parse_args(["--round-wait-s", "5", "--sync-steps", "0"]))
    with pytest.raises(ValueError, match="for DQN"):
        cli.settings_from(
            cli.parse_args(["--round-wait-s", "5", "--sync-steps", "128", "--algo", "dqn", "ppo"])
        )


def test_the_lone_references_may_run_a_budget_of_their_own() -> None:
    settings = cli.settings_from(cli.parse_args(["--budget", "2000", "--offline-budget", "6000"]))

    assert settings.of("offline").budget_steps == 6_000
    assert settings.of("offline").marks[-1] == 6_000
    assert settings.of("both").budget_steps == settings.of("pooled").budget_steps == 2_000
    assert settings.of("pooled").pooled(2).budget_steps == 4_000
    assert Settings().of("offline") == Settings()
    with pytest.raises(SystemExit, match="at least one mark"):
        cli.settings_from(cli.parse_args(["--offline-budget", "100"]))


def test_a_lone_learner_starts_from_version_zero_of_the_same_seed() -> None:
    settings = Settings()

    first = participant.initial_weights(settings, 3, "dqn")
    again = participant.initial_weights(settings, 3, "dqn")
    other = participant.initial_weights(settings, 4, "dqn")

    for (name, a), (_, b) in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert not all(np.array_equal(a, b) for (_, a), (_, b) in zip(first, other, strict=True))


def test_a_paced_actor_waits_until_the_learner_has_taken_as_many_env_steps(
    tmp_path: Path,
) -> None:
    pace = StepPace(tmp_path / "learner_steps")
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


def test_roles_actors_follow_the_learner_and_even_pace_has_everyone_follow_the_rest() -> None:
    free = cli.settings_from(cli.parse_args([]))
    even = cli.settings_from(cli.parse_args(["--even-pace"]))
    both = Configuration(n=3, mode="both")
    roles = Configuration(n=3, mode="roles")

    assert not free.even_pace and even.even_pace
    assert [paced_by(both, free, index) for index in range(3)] == [[], [], []]
    assert [paced_by(roles, free, index) for index in range(3)] == [[], [0], [0]]
    assert [paced_by(both, even, index) for index in range(3)] == [[1, 2], [0, 2], [0, 1]]
    assert paced_by(Configuration(n=2, mode="pooled"), even, 0) == []


def test_envs_per_participant_reach_the_settings_and_fewer_than_one_stop_the_bench() -> None:
    settings = cli.settings_from(cli.parse_args(["--envs-per-participant", "64"]))

    assert settings.envs_per_participant == 64
    with pytest.raises(SystemExit, match="--envs-per-participant must be at least 1"):
        cli.settings_from(cli.parse_args(["--envs-per-participant", "0"]))


def test_a_participant_process_needs_exactly_its_task() -> None:
    with pytest.raises(SystemExit, match=r"usage: python -m bench\.federation\.participant"):
        participant.main([])


def test_the_seeding_join_creates_the_session_with_the_rules_the_participants_choose(
    tmp_path: Path,
) -> None:
    # prepare: a run whose participants ask for credits other than the session defaults'
    settings = Settings(foreign_credit=3.0, round_foreign_credit=0.5, rounds_from=4)
    configuration = Configuration(n=2, mode="both")
    weights = participant.initial_weights(settings, 0, "dqn")

    # act
    with InProcessServer(server_config(tmp_path)) as server:
        runner.seed_session(server.address, weights, settings, configuration)
        spec = model_spec(
            settings.env,
            weights,
            participant.architecture(participant.learner_config(settings, "dqn")),
        )
        choices = choices_to_proto(settings.rule_choices("both"))
        reply = join(server.stub(), "p0", spec, rules=choices)

    # assert: the session took them, so a participant choosing alike is let in
    rules = rules_from_proto(reply.config.rules)
    assert (rules.foreign_credit, rules.round_foreign_credit, rules.rounds_from) == (3.0, 0.5, 4)
