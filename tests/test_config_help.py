"""Help by section: `--help` fits two screens, every option is one `--help-section` away."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import main as client_main
from fedrl.common.config_help import FieldOption
from fedrl.server.cli import main as server_main
from fedrl.server.cli import serve_command

PROGRAMS = {
    "fedrl-client": client_main,
    "fedrl-server": server_main,
    "fedrl-server serve": serve_command,
}
SCREENS = 80
"""Two screens of 40 lines."""


def help_text(command: click.Command, *args: str) -> str:
    result = CliRunner().invoke(command, list(args), terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def field_options(command: click.Command) -> list[FieldOption]:
    return [p for p in command.params if isinstance(p, FieldOption)]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_help_fits_two_screens_and_names_every_section(name: str) -> None:
    command = PROGRAMS[name]

    text = help_text(command, "--help")

    assert len(text.splitlines()) <= SCREENS
    for option in field_options(command):
        assert option.section.name in text
        assert (option.opts[0] in text) == option.common, option.opts[0]
    for other in ("--config FILE", "--print-config", "--help-all", "--help-section NAME"):
        assert other in text


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_each_section_shows_its_options_in_full_and_no_others(name: str) -> None:
    command = PROGRAMS[name]
    options = field_options(command)

    for part in {option.section for option in options}:
        # act
        text = help_text(command, "--help-section", part.name)

        # assert
        for option in options:
            shown = f"  {option.opts[0]} " in text or f"  {option.opts[0]}\n" in text
            assert shown == (option.section == part), (part.name, option.opts[0])


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_help_all_shows_every_option(name: str) -> None:
    command = PROGRAMS[name]

    text = help_text(command, "--help-all")

    for option in field_options(command):
        assert f"  {option.opts[0]}" in text


def test_an_unknown_section_is_refused_with_the_names_there_are() -> None:
    result = CliRunner().invoke(client_main, ["--help-section", "dqn"])

    assert result.exit_code == 2
    assert "'dqn' is not one of 'run', 'engine', 'self_play', 'learner'" in result.output


def test_a_command_with_one_section_keeps_its_plain_help() -> None:
    text = help_text(server_main, "status", "--help")

    assert "Options:" in text
    assert "--help-all" not in text and "--config" not in text


def test_a_subcommand_shows_its_nested_section_under_its_own_heading() -> None:
    text = help_text(client_main, "plot", "--help")

    top, tls = text.split("tls — ")
    assert "--state-dir" in top and "--bundle" not in top
    assert "--bundle" in tls and "--state-dir" not in tls
