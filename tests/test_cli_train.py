"""`fedrl-client --offline`: options mirror the config, a tiny run trains, saves and resumes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import main
from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.channel import ConnectionSecurity
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.self_play_config import SelfPlayConfig
from fedrl.common.config_help import FieldOption
from fedrl.common.group_rules import RuleChoices
from fedrl.envs.market_source import MarketSource

SECTIONS = ("rules", "tls", "engine", "learner", "network", "ppo", "exchange", "market")
"""TrainConfig fields that are configs of their own; their fields become options too."""
DERIVED = {
    ("learner", "seed"),
    ("ppo", "seed"),
    ("ppo", "device"),
    ("ppo", "amp"),
    ("engine", "self_play"),
}
"""Fields with no option: learner seeds come from the engine's seed stream, PPO's device and
amp are the learner section's, and the engine's self-play config is a section of its own."""

TINY = [
    "--offline",
    "--workers", "0",
    "--envs-per-worker", "4",
    "--steps-per-slot", "4",
    "--learning-starts", "100",
    "--hidden", "16",
    "--batch-size", "8",
    "--eval-interval", "300",
    "--eval-episodes", "2",
    "--save-model-every", "5",
    "--save-progress-every", "20",
]  # fmt: skip


def test_every_config_field_has_an_option_and_every_option_a_field() -> None:
    # prepare
    fields = {f.name for f in dataclasses.fields(TrainConfig) if f.name not in SECTIONS}
    for section, cls in (
        ("rules", RuleChoices),
        ("tls", ConnectionSecurity),
        ("engine", EngineConfig),
        ("self_play", SelfPlayConfig),
        ("learner", LearnerConfig),
        ("network", NetworkConfig),
        ("ppo", PPOConfig),
        ("exchange", ExchangeConfig),
        ("market", MarketSource),
    ):
        fields |= {f.name for f in dataclasses.fields(cls) if (section, f.name) not in DERIVED}

    # act
    options = [p for p in main.params if isinstance(p, FieldOption)]

    # assert
    assert {p.name for p in options} == fields
    assert all(p.help for p in options), "every option needs its field's help text"


def test_a_tiny_offline_run_trains_and_fills_the_state_dir(tmp_path: Path) -> None:
    # act
    result = CliRunner().invoke(
        main, ["--participant-id", "Макар", "--episodes", "30", "--state-dir", str(tmp_path), *TINY]
    )

    # assert
    assert result.exit_code == 0, result.output
    state = tmp_path / "Макар"
    assert {p.name for p in state.iterdir()} >= {"model.pt", "progress.pt", "metrics.jsonl"}
    records = [json.loads(line) for line in (state / "metrics.jsonl").read_text().splitlines()]
    episodes = [r["episode"] for r in records if r["kind"] == "episode"]
    assert episodes == list(range(1, len(episodes) + 1)) and len(episodes) >= 30
    assert "stopped at episode" in result.output


def test_a_second_run_resumes_the_counters(tmp_path: Path) -> None:
    # prepare
    args = ["--participant-id", "ann", "--state-dir", str(tmp_path), *TINY]
    first = CliRunner().invoke(main, [*args, "--episodes", "20"])
    assert first.exit_code == 0, first.output

    # act
    second = CliRunner().invoke(main, [*args, "--episodes", "40"])

    # assert
    assert second.exit_code == 0, second.output
    assert "resuming ann at episode" in second.output
    lines = (tmp_path / "ann" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    episodes = [r["episode"] for r in records if r["kind"] == "episode"]
    # Both runs together number their episodes 1, 2, ... without gap or repeat.
    assert episodes == list(range(1, len(episodes) + 1)) and len(episodes) >= 40


def test_training_without_a_participant_id_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["--offline"])

    assert result.exit_code == 2
    assert "--participant-id is required" in result.output


def test_a_bad_value_names_the_setting(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["--participant-id", "ann", "--offline", "--envs-per-worker", "0"]
    )

    assert result.exit_code != 0
    assert "envs_per_worker must be at least 1" in result.output


def test_subcommands_attach_to_the_group_and_need_no_training_options() -> None:
    # prepare
    @click.command("hello")
    def hello() -> None:
        click.echo("hi")

    main.add_command(hello)
    try:
        # act
        result = CliRunner().invoke(main, ["hello"])
    finally:
        main.commands.pop("hello")

    # assert
    assert result.exit_code == 0 and result.output == "hi\n"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--round-wait-s", "5", "--sync-steps", "0"], "give --sync-steps"),
        (["--round-wait-s", "5", "--rounds-from", "0"], "rounds_from must be a whole number in 1"),
        (["--round-wait-s", "5", "--sync-steps", "128", "--share", "experience"], "--share"),
        (["--round-wait-s", "-1", "--sync-steps", "128"], "round_wait_s must be a number"),
        (["--round-wait-s", "nan", "--sync-steps", "128"], "round_wait_s must be a number"),
    ],
)
def test_synchronous_rounds_that_could_not_form_are_refused_before_training(
    tmp_path: Path, options: list[str], named: str
) -> None:
    result = CliRunner().invoke(
        main, ["--participant-id", "ann", "--state-dir", str(tmp_path / "state"), *options]
    )

    assert result.exit_code != 0
    assert named in result.output
    assert not (tmp_path / "state").exists()
