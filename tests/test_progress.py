"""The progress line: documented fields in plain mode, throttling, the terminal bar."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest

from fedrl.client.commands.gpu_stats import GpuMonitor
from fedrl.client.commands.progress import (
    PROGRESS_FIELDS,
    ProgressReporter,
    RateMeter,
    TrainingProgress,
    mean_epsilon,
)
from fedrl.client.federation.server_link import ServerView
from fedrl.client.training.counters import Counters, PollResult
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.evaluation import EvalResult, MatchRecord
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.fake_nvml import fake_nvml

FEDERATED = {"version", "participants", "sync", "session_episodes", "session_goal"}
POPULATION = {"generation"}
GAMES = {"rating", "games"}
"""Shown for a member of a population session (tests/test_population_training.py)."""
GPU = {"gpus"}
"""Shown only where NVIDIA's management library finds a GPU (tests/test_gpu_stats.py)."""


class FakeClock:
    """A clock the test moves by hand, so no assertion depends on real timing."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def poll_result(*, loss: float | None = None, evaluated: bool = False) -> PollResult:
    return PollResult(
        episode_returns=(10.0,),
        episode_lengths=(10,),
        env_steps=100,
        updates=50,
        train_metrics={} if loss is None else {"loss": loss},
        evaluation=EvalResult(returns=(200.0,), seconds=0.1) if evaluated else None,
        new_best=evaluated,
    )


def parse_line(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split()[1:])


def test_plain_mode_line_carries_every_documented_field_of_a_federated_run() -> None:
    # Prepare
    stream, clock = io.StringIO(), FakeClock()
    reporter = ProgressReporter(stream=stream, tty=False, interval_s=5.0, clock=clock)
    progress = TrainingProgress(
        reporter,
        target=500,
        epsilon=0.05,
        replay_size=lambda: 4321,
        gpus=GpuMonitor(nvml=lambda: fake_nvml(gpus=1)),
        clock=clock,
    )
    view = ServerView(
        connected=True,
        version=12,
        goal=pb.GoalState(total_episodes=5000, episodes_done=1234),
        active_participants=3,
    )
    # Act: two polls 6 s apart, so rates exist and the second one is due.
    progress(
        Counters(episodes=100, env_steps=10_000, updates=5_000),
        poll_result(loss=0.5),
        view,
        sync_mode="warmup",
    )
    clock.now += 6.0
    progress(
        Counters(
            episodes=120,
            env_steps=16_000,
            updates=8_000,
            best_eval=200.0,
            recent_returns=(80.0, 90.0),
        ),
        poll_result(loss=0.25),
        view,
        sync_mode="async",
    )
    # Assert
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    fields = parse_line(lines[-1])
    assert set(fields) == {f.name for f in PROGRESS_FIELDS} - {"target", *POPULATION, *GAMES}
    assert fields["episodes"] == "120/500"
    assert fields["env_steps_per_s"] == "1000"
    assert fields["updates_per_s"] == "500"
    assert fields["epsilon"] == "0.050"
    assert fields["mean_return"] == "85.0"
    assert fields["best_eval"] == "200.0"
    assert fields["replay_size"] == "4321"
    assert fields["loss"] == "0.2500"
    assert (fields["version"], fields["participants"], fields["sync"]) == ("12", "3", "async")
    assert (fields["session_episodes"], fields["session_goal"]) == ("1234", "5000")


def test_a_real_training_run_reports_every_offline_field() -> None:
    # Prepare: the engine as the training command drives it, stderr not a terminal.
    engine = TrainingEngine(
        EngineConfig(workers=0, envs_per_worker=4, eval_interval=400, eval_episodes=2),
        LearnerConfig(hidden=(32,), learning_starts=100, batch_size=32, device="cpu"),
    )
    stream = io.StringIO()
    reporter = ProgressReporter(stream=stream, tty=False, interval_s=3600.0)
    progress = TrainingProgress(
        reporter,
        target=30,
        epsilon=mean_epsilon(4, base=0.4, alpha=7.0),
        replay_size=lambda: len(engine.learner.replay),
    )
    # Act
    with engine:
        engine.run(
            lambda c: c.episodes >= 30 and c.best_eval is not None,
            on_poll=lambda result: progress(engine.counters, result),
        )
    reporter.close()
    # Assert: the last line (written at close) has a value for every field.
    fields = parse_line(stream.getvalue().splitlines()[-1])
    offline = {f.name for f in PROGRESS_FIELDS} - {
        "target",
        *FEDERATED,
        *GPU,
        *POPULATION,
        *GAMES,
    }
    assert set(fields) == offline
    assert all(value != "-" for value in fields.values()), fields
    assert int(fields["replay_size"]) > 0


def test_a_two_player_game_shows_the_learners_rating_and_its_record_against_the_baselines() -> None:
    stream = io.StringIO()
    reporter = ProgressReporter(stream=stream, tty=False, clock=FakeClock())
    progress = TrainingProgress(reporter, target=10, epsilon=0.1, replay_size=lambda: 0)
    matches = (
        MatchRecord("random", 0, wins=10, draws=0, losses=0),
        MatchRecord("random", 1, wins=9, draws=0, losses=1),
        MatchRecord("lookahead", 0, wins=5, draws=5, losses=0),
        MatchRecord("lookahead", 1, wins=2, draws=4, losses=4),
    )
    result = dataclasses.replace(
        poll_result(),
        evaluation=EvalResult(returns=(1.0,), seconds=0.1, matches=matches),
        rating=812.4,
    )

    progress(Counters(), result)

    fields = parse_line(stream.getvalue().splitlines()[0])
    assert fields["rating"] == "812"
    assert fields["games"] == "random:95/0/5,lookahead:35/45/20"


def test_plain_mode_shows_unknown_values_as_dash_and_omits_federated_fields_offline() -> None:
    stream = io.StringIO()
    reporter = ProgressReporter(stream=stream, tty=False, clock=FakeClock())
    progress = TrainingProgress(reporter, target=10, epsilon=0.1, replay_size=lambda: 0)

    progress(Counters(), poll_result())

    fields = parse_line(stream.getvalue().splitlines()[0])
    assert fields["mean_return"] == "-"
    assert fields["best_eval"] == "-"
    assert fields["loss"] == "-"
    assert fields["env_steps_per_s"] == "-"
    assert "version" not in fields
    assert "participants" not in fields


def test_plain_mode_writes_one_line_per_interval_not_per_update() -> None:
    stream, clock = io.StringIO(), FakeClock()
    reporter = ProgressReporter(stream=stream, tty=False, interval_s=5.0, clock=clock)

    for step in range(41):  # 41 updates over 10 s: lines at 0 s, 5 s and 10 s
        reporter.update(episodes=step)
        clock.now += 0.25

    lines = stream.getvalue().splitlines()
    assert [parse_line(line)["episodes"] for line in lines] == ["0", "20", "40"]


def test_forced_update_and_close_write_lines_at_once() -> None:
    stream, clock = io.StringIO(), FakeClock()
    reporter = ProgressReporter(stream=stream, tty=False, interval_s=60.0, clock=clock)

    reporter.update(episodes=1)
    reporter.update(episodes=2)
    reporter.update(episodes=3, best_eval=150.0, force=True)
    reporter.update(episodes=4)
    reporter.close()

    episodes = [parse_line(line)["episodes"] for line in stream.getvalue().splitlines()]
    assert episodes == ["1", "3", "4"]


def test_evaluation_round_forces_a_line() -> None:
    stream, clock = io.StringIO(), FakeClock()
    reporter = ProgressReporter(stream=stream, tty=False, interval_s=60.0, clock=clock)
    progress = TrainingProgress(
        reporter, target=10, epsilon=0.1, replay_size=lambda: 0, clock=clock
    )

    progress(Counters(episodes=1), poll_result())
    progress(Counters(episodes=2, best_eval=200.0), poll_result(evaluated=True))

    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert parse_line(lines[1])["best_eval"] == "200.0"


def test_unknown_field_name_is_refused_with_the_documented_names() -> None:
    reporter = ProgressReporter(stream=io.StringIO(), tty=False)

    with pytest.raises(ValueError, match=r"unknown progress field.*'epsilon'"):
        reporter.update(epsilom=0.1)


def test_terminal_mode_draws_a_bar_with_count_and_labels() -> None:
    stream, clock = io.StringIO(), FakeClock()
    reporter = ProgressReporter(stream=stream, tty=True, clock=clock)

    reporter.update(episodes=40, target=100, env_steps_per_s=123_456.0, loss=0.5, version=7)
    reporter.close()

    text = stream.getvalue()
    assert "\r" in text  # drawn in place, not as log lines
    last = text.rstrip("\n").split("\r")[-1]
    assert re.search(r"40/100", last)
    assert "steps/s 123.5k" in last
    assert "loss 0.5000" in last
    assert "v 7" in last


def test_terminal_mode_message_is_written_on_its_own_line() -> None:
    stream = io.StringIO()
    reporter = ProgressReporter(stream=stream, tty=True, clock=FakeClock())
    reporter.update(episodes=1, target=10)

    reporter.write("resuming Макар at episode 1")
    reporter.close()

    assert "resuming Макар at episode 1\n" in stream.getvalue()


def test_rate_meter_reports_recent_speed_after_a_slowdown() -> None:
    meter = RateMeter(window_s=10.0)
    total = 0.0
    for second in range(30):  # 1000/s for 20 s, then 100/s for 10 s
        total += 1000.0 if second < 20 else 100.0
        rate = meter.add(float(second), total)

    assert rate is not None
    assert rate == pytest.approx(100.0, rel=0.15)


def test_rate_meter_has_no_rate_from_one_sample() -> None:
    assert RateMeter().add(5.0, 100.0) is None


def test_mean_epsilon_lies_between_the_greediest_and_the_most_exploring_env() -> None:
    eps = mean_epsilon(64, base=0.4, alpha=7.0)

    assert 0.4**8 < eps < 0.4
