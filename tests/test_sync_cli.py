"""The federated options of `fedrl-client`: participant ids, status mode, option names."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import PARTICIPANT_ID_FILE, main, resolve_participant_id
from fedrl.client.commands.config import TrainConfig


def test_missing_participant_id_is_generated_once_and_remembered(tmp_path: Path) -> None:
    config = TrainConfig(state_dir=tmp_path / "state")

    first = resolve_participant_id(config).participant_id
    again = resolve_participant_id(config).participant_id

    assert first.startswith("participant-")
    assert again == first
    assert (tmp_path / "state" / PARTICIPANT_ID_FILE).read_text(encoding="utf-8").strip() == first


def test_given_participant_id_is_kept_and_nothing_is_written(tmp_path: Path) -> None:
    config = TrainConfig(participant_id="Макар", state_dir=tmp_path / "state")

    assert resolve_participant_id(config).participant_id == "Макар"
    assert not (tmp_path / "state").exists()


def test_remembered_id_that_is_not_valid_is_refused(tmp_path: Path) -> None:
    (tmp_path / PARTICIPANT_ID_FILE).write_text("a/b\n", encoding="utf-8")

    with pytest.raises(ValueError, match="must not contain"):
        resolve_participant_id(TrainConfig(state_dir=tmp_path))


def test_status_mode_refuses_offline() -> None:
    result = CliRunner().invoke(main, ["--episodes", "0", "--offline"])

    assert result.exit_code == 2
    assert "drop --offline" in result.output


def test_status_of_an_unreachable_server_fails_with_a_message() -> None:
    result = CliRunner().invoke(main, ["--episodes", "0", "--server", "127.0.0.1:1"])

    assert result.exit_code == 1
    assert "status" in result.output


def test_help_all_lists_the_options_users_of_the_old_tools_know() -> None:
    result = CliRunner().invoke(main, ["--help-all"])

    for option in (
        "--participant-id",
        "--server",
        "--session",
        "--episodes",
        "--total-episodes",
        "--sync-interval",
        "--env",
        "--device",
        "--workers",
        "--envs-per-worker",
        "--state-dir",
        "--offline",
    ):
        assert option in result.output


def test_training_options_before_a_command_are_refused_not_ignored(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--state-dir", str(tmp_path), "plot"])

    assert result.exit_code == 2
    assert "--state-dir before `plot`" in result.output
