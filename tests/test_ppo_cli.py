"""`fedrl-client --algo ppo`: tiny runs train, resume, export, plot; wrong options are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from fedrl.client.commands.cli import main
from fedrl.client.commands.config import TrainConfig, check_algorithm_options
from fedrl.client.commands.export import ExportConfig, export_model
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.sync_plan import effective_share
from fedrl.common.group_rules import RuleChoices

TINY = [
    "--algo", "ppo",
    "--offline",
    "--workers", "0",
    "--envs-per-worker", "4",
    "--rollout-steps", "16",
    "--epochs", "2",
    "--minibatch-size", "32",
    "--ppo-hidden", "16",
    "--eval-interval", "200",
    "--eval-episodes", "2",
    "--save-model-every", "5",
    "--save-progress-every", "10",
]  # fmt: skip


def train(tmp_path: Path, *args: str) -> str:
    result = CliRunner().invoke(
        main, ["--participant-id", "Макар", "--state-dir", str(tmp_path), *TINY, *args]
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_a_tiny_ppo_run_saves_resumes_on_the_same_schedule_and_exports(tmp_path: Path) -> None:
    # act: two runs of the same participant, then an export of its model
    train(tmp_path, "--episodes", "20", "--env", "Pendulum-v1")
    first = torch.load(tmp_path / "Макар" / "progress.pt", weights_only=True)
    output = train(tmp_path, "--episodes", "5", "--env", "Pendulum-v1")
    second = torch.load(tmp_path / "Макар" / "progress.pt", weights_only=True)
    report = export_model(
        ExportConfig(
            model=tmp_path / "Макар" / "model.pt", format="torchscript", out=tmp_path / "pi.pt"
        )
    )
    plotted = CliRunner().invoke(
        main, ["plot", "--state-dir", str(tmp_path), "--out", str(tmp_path / "plots")]
    )

    # assert
    assert "resuming Макар at episode 20" in output
    assert first["architecture"] == "ppo/mlp-16"
    # Pendulum's 4 envs end their 200-step episodes together: 20, 24, 28.
    assert second["counters"]["episodes"] == 28
    learner = second["learner"]
    assert learner["algorithm"] == "ppo"
    assert learner["env_steps"] > first["learner"]["env_steps"], "the schedule's clock went on"
    assert learner["rounds"] > first["learner"]["rounds"]
    records = [
        json.loads(line) for line in (tmp_path / "Макар" / "metrics.jsonl").read_text().splitlines()
    ]
    trains = [r for r in records if r["kind"] == "train"]
    assert trains and {"policy_loss", "value_loss", "approx_kl"} <= set(trains[-1])
    assert "replay_size" not in trains[-1]
    assert report.n_actions == 0 and "'action' float32 [batch, 1]" in report.output
    assert plotted.exit_code == 0, plotted.output
    assert {"returns.png", "loss.png"} <= {p.name for p in (tmp_path / "plots").iterdir()}


def test_experience_exchange_options_are_refused_for_ppo_even_at_their_defaults(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(
        main,
        ["--participant-id", "a", "--state-dir", str(tmp_path), *TINY, "--foreign-credit", "0.25"],
    )

    assert result.exit_code != 0
    assert "--algo ppo does not take --foreign-credit" in result.output
    assert "off-policy" in result.output
    assert not (tmp_path / "a").exists()


def test_dqn_only_and_ppo_only_options_are_refused_with_the_other_algorithm(
    tmp_path: Path,
) -> None:
    dqn_option = CliRunner().invoke(main, ["--participant-id", "a", *TINY, "--n-step", "5"])
    ppo_option = CliRunner().invoke(
        main, ["--participant-id", "a", "--offline", "--clip-range", "0.1"]
    )

    assert dqn_option.exit_code != 0 and "does not take --n-step" in dqn_option.output
    assert ppo_option.exit_code != 0
    assert "--clip-range set PPO's learner: add --algo ppo" in ppo_option.output


def test_device_and_amp_serve_either_algorithm_and_are_refused_for_neither() -> None:
    given = {"device", "amp"}

    check_algorithm_options(TrainConfig(algo="dqn"), given)
    check_algorithm_options(TrainConfig(algo="ppo"), given)


def test_a_config_for_ppo_with_experience_exchange_is_refused() -> None:
    with pytest.raises(ValueError, match="--foreign-credit, --pull-transitions"):
        TrainConfig(
            algo="ppo",
            rules=RuleChoices(foreign_credit=0.5),
            exchange=ExchangeConfig(pull_transitions=10),
        )


def test_ppo_configs_exchange_no_experience_and_take_device_and_amp_from_the_learner() -> None:
    config = TrainConfig(algo="ppo")

    ppo = config.learner_config

    assert effective_share(config.own_rules().share, on_policy=True) == "weights"
    assert ppo.device == config.learner.device  # type: ignore[union-attr]
    assert ppo.amp == ("auto" if config.learner.amp else "off")  # type: ignore[union-attr]
    assert config.architecture() == "ppo/mlp-64x64"


def test_dqn_on_box_actions_says_to_use_ppo(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "--participant-id",
            "a",
            "--offline",
            "--env",
            "Pendulum-v1",
            "--state-dir",
            str(tmp_path),
        ],
    )

    assert result.exit_code != 0
    assert "DQN needs a discrete action space" in result.output and "--algo ppo" in result.output


def test_a_transformer_ppo_run_trains_on_observation_windows(tmp_path: Path) -> None:
    train(
        tmp_path,
        "--episodes",
        "6",
        "--policy",
        "transformer",
        "--context",
        "4",
        "--transformer-width",
        "16",
        "--transformer-layers",
        "1",
    )

    saved = torch.load(tmp_path / "Макар" / "model.pt", weights_only=True)
    assert saved["architecture"] == "ppo/transformer-k4-l1-w16"
    assert tuple(saved["tensors"]["policy.torso.position"].shape) == (4, 16)
    assert np.isfinite(saved["tensors"]["policy.head.weight"].numpy()).all()
