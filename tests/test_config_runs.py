"""Real runs record their settings: what `fedrl-client config` and `fedrl-server config` print
runs again as it was, and a federated run that ends by its budget ends cleanly (no task left
pending, no "Task was destroyed but it is pending!")."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import main as client_main
from fedrl.client.commands.config import TrainConfig
from fedrl.common.config_cli import config_from_options
from fedrl.common.config_file import read_config_file, settings_from_toml
from fedrl.server.cli import ServeConfig
from fedrl.server.cli import main as server_main
from fedrl.server.config import ServerConfig
from tests.support.server_harness import ServerProcess

TINY = [
    "--episodes", "6", "--workers", "0", "--envs-per-worker", "2", "--hidden", "16",
    "--learning-starts", "32", "--batch-size", "8", "--eval-interval", "0",
    "--sync-interval", "1", "--tensorboard", "off",
]  # fmt: skip
UNCLEAN = ("Task was destroyed", "Event loop is closed", "Traceback")
"""What a normal end of fedrl-client must not print."""


def recorded(state: Path, participant: str) -> TrainConfig:
    path = state / participant / "config.toml"
    return config_from_options(TrainConfig, read_config_file(TrainConfig, path))


def test_a_run_from_its_recorded_config_repeats_the_run_from_flags(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # prepare
    state = tmp_path / "state dirs"
    file = tmp_path / "run.toml"
    with ServerProcess(tmp_path / "server") as server:
        flags = ["--participant-id", "Макар", "--server", server.address, *TINY]
        flags += ["--state-dir", str(state)]

        # act: a run from flags; its recorded config printed; a run from that file
        with caplog.at_level(logging.WARNING):
            first = CliRunner().invoke(client_main, flags)
            gc.collect()
            pending = [
                o for o in gc.get_objects() if issubclass(type(o), asyncio.Task) and not o.done()
            ]
        printed = CliRunner().invoke(
            client_main, ["config", "--state-dir", str(state), "--participant-id", "Макар"]
        )
        file.write_text(printed.output, encoding="utf-8")
        second = CliRunner().invoke(
            client_main, ["--config", str(file), "--participant-id", "alice"]
        )

    # assert: both ran; the first ended cleanly, nothing of its network thread left pending;
    # the two runs had one configuration
    for run in (first, printed, second):
        assert run.exit_code == 0, run.output
    assert "stopped at episode" in first.output
    said = first.output + caplog.text
    assert not [word for word in UNCLEAN if word in said], said
    assert pending == []
    from_flags = expected(*flags)
    assert recorded(state, "Макар") == from_flags
    assert recorded(state, "alice") == dataclasses.replace(from_flags, participant_id="alice")


def expected(*args: str) -> TrainConfig:
    """The configuration `fedrl-client ARGS` runs with, as --print-config says."""
    result = CliRunner().invoke(client_main, [*args, "--print-config"])
    assert result.exit_code == 0, result.output
    document = tomllib.loads(result.output)
    return config_from_options(TrainConfig, settings_from_toml(TrainConfig, document, source="-"))


def test_the_config_of_a_state_dir_that_holds_no_run_is_an_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(client_main, ["config", "--state-dir", str(tmp_path)])

    assert result.exit_code == 1
    assert f"no recorded configuration under {tmp_path}" in result.output


def test_a_server_records_its_settings_and_serves_again_from_them(tmp_path: Path) -> None:
    # prepare
    data = tmp_path / "data"
    options = ["--goal-episodes", "77", "--strategy", "median", "--session-strategy", "ü=mean"]
    with ServerProcess(data, *options):
        # act
        printed = CliRunner().invoke(server_main, ["config", "--data-dir", str(data)])
    file = tmp_path / "server.toml"
    file.write_text(printed.output, encoding="utf-8")
    again = CliRunner().invoke(server_main, ["serve", "--config", str(file), "--print-config"])

    # assert
    assert printed.exit_code == 0, printed.output
    config = config_from_options(ServeConfig, read_config_file(ServeConfig, file))
    # The launcher's own options, then the test's.
    assert config == ServeConfig(
        server=ServerConfig(
            port=0,
            data_dir=data,
            dashboard_port=0,
            goal_episodes=77,
            strategy="median",
            session_strategy=("ü=mean",),
        ),
        log_level="WARNING",
    )
    assert again.output == printed.output
