"""Games train with their own settings unless told otherwise; memory is accounted for at start."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedrl.client.commands.check.recommendation import Recommendation, with_capacity
from fedrl.client.commands.cli import main
from fedrl.client.commands.config import TrainConfig
from fedrl.client.commands.game_defaults import GAME_LEARNER, GAME_PPO, with_game_defaults
from fedrl.client.training import memory
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.frame_replay import FrameReplay
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.memory import fitting_capacity, replay_bytes, stacked_bytes
from fedrl.client.training.replay import PrioritizedReplay

STACK = (4, 84, 84)


def game(algo: str = "dqn", **learner: object) -> TrainConfig:
    return TrainConfig(
        algo=algo,  # type: ignore[arg-type]
        engine=EngineConfig(env="ALE/Breakout-v5"),
        learner=dataclasses.replace(LearnerConfig(), **learner),  # type: ignore[arg-type]
    )


def test_games_get_their_settings_and_options_given_keep_their_values() -> None:
    config, settings = with_game_defaults(game(lr=3e-4), given={"lr"})

    assert config.learner.lr == 3e-4 and "lr" not in settings
    assert config.learner.batch_size == GAME_LEARNER["batch_size"] == settings["batch_size"]
    assert config.engine.replay_ratio == 0.25
    assert 1 <= config.learner.replay_capacity <= 1_000_000


def test_ppo_on_games_gets_the_atari_ppo_settings() -> None:
    config, settings = with_game_defaults(game("ppo"), given=set())

    assert config.ppo.rollout_steps == GAME_PPO["rollout_steps"]
    assert config.ppo.clip_range == 0.1 and config.engine.envs_per_worker == 8
    assert "lr" not in settings  # DQN's settings stay out of a PPO run


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_two_player_games_get_their_settings_and_dqn_its_discount(algo: str) -> None:
    board = TrainConfig(algo=algo, engine=EngineConfig(env="pettingzoo/connect_four_v3"))  # type: ignore[arg-type]

    config, settings = with_game_defaults(board, given=set())
    assert config.engine.eval_episodes == 50 and config.save_model_every == 1_000
    assert config.engine.replay_ratio == 0.25
    assert config.learner.gamma == (0.9 if algo == "dqn" else LearnerConfig().gamma)
    assert config.learner.lr == (3e-4 if algo == "dqn" else LearnerConfig().lr)
    assert ("gamma" in settings) == (algo == "dqn")
    assert config.ppo == board.ppo
    kept, settings = with_game_defaults(board, given={"gamma"})
    assert kept.learner.gamma == LearnerConfig().gamma and "gamma" not in settings


def test_other_envs_keep_every_default() -> None:
    config = TrainConfig()

    assert with_game_defaults(config, given=set()) == (config, {})


def test_the_default_game_replay_takes_at_most_half_the_memory_available() -> None:
    capacity = fitting_capacity(STACK, available=8 * 10**9)

    assert replay_bytes(capacity, STACK) <= 4 * 10**9 < replay_bytes(capacity + 1_000, STACK)
    assert fitting_capacity(STACK, available=10**13) == 1_000_000


def test_memory_accounting_matches_what_the_replays_allocate() -> None:
    for capacity in (10, 1_000, 12_345):
        assert replay_bytes(capacity, STACK) == FrameReplay(capacity, STACK, seed=0).nbytes
        assert replay_bytes(capacity, (4,)) == PrioritizedReplay(capacity, (4,), seed=0).nbytes
    # Each frame once: about an eighth of whole uint8 stacks.
    assert 7 < stacked_bytes(10**6, STACK, itemsize=1) / replay_bytes(10**6, STACK) < 8


def test_check_recommends_a_replay_capacity_for_a_game() -> None:
    plain = Recommendation(1, 16, 32, "cpu", ("collection",), env="ALE/Breakout-v5")

    advice = with_capacity(plain, STACK)

    assert advice.replay_capacity is not None and advice.replay_capacity > 0
    assert f"--replay-capacity {advice.replay_capacity}" in advice.command()
    assert "--env ALE/Breakout-v5" in advice.command()
    assert "replay capacity" in advice.reasons[-1] and "GB" in advice.reasons[-1]


def test_a_game_run_reports_its_settings_and_memory_and_trains_on_frames(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "--offline",
            "--participant-id",
            "Макар",
            "--state-dir",
            str(tmp_path),
            "--env",
            "ALE/Breakout-v5",
            "--workers",
            "0",
            "--envs-per-worker",
            "4",
            "--max-env-steps",
            "1000",
            "--learning-starts",
            "300",
            "--replay-capacity",
            "2000",
            "--eval-interval",
            "0",
        ],
    )

    assert result.exit_code == 0, result.output
    assert "game settings for ALE/Breakout-v5: --replay-ratio 0.25" in result.output
    assert "--learning-starts" not in result.output.split("game settings", 1)[1].split("\n")[0]
    assert "memory: replay" in result.output and "whole uint8 stacks would take" in result.output
    records = [
        json.loads(line) for line in (tmp_path / "Макар" / "metrics.jsonl").read_text().splitlines()
    ]
    # Random Breakout games last about 200 steps: each env of the four ends some.
    assert any(r["kind"] == "train" and r["updates"] > 0 for r in records)
    assert (tmp_path / "Макар" / "model.pt").exists()


def test_learner_ranks_on_one_machine_split_the_game_replays_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "available_bytes", lambda: 8 * 10**9)

    alone, _ = with_game_defaults(game(), given=set())
    four, _ = with_game_defaults(game(), given=set(), replays=4)

    # Each of the four ranks keeps a replay: together they take what one would.
    assert alone.learner.replay_capacity == fitting_capacity(STACK, available=8 * 10**9)
    assert four.learner.replay_capacity == fitting_capacity(STACK, available=2 * 10**9)
    assert 4 * replay_bytes(four.learner.replay_capacity, STACK) <= 4 * 10**9
    with pytest.raises(ValueError, match="replays must be at least 1"):
        with_game_defaults(game(), given=set(), replays=0)
