"""Every fedrl command the README and docs/ show parses: its options exist on that command.

Each line of a fenced code block that runs `fedrl-client` or `fedrl-server`
is parsed by the real click command with `--help` appended: click refuses an
option the command does not have before it prints help, and prints help
without running anything. Shell around the command (a `.venv/bin/` prefix,
`torchrun ... --no-python`, a redirect, a comment) is cut off.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import main as client_main
from fedrl.server.cli import main as server_main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS: dict[str, click.Command] = {"fedrl-client": client_main, "fedrl-server": server_main}
SHELL_OPERATORS = {">", ">>", "<", "|", "&&", "||", ";", "&"}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def shown_commands() -> list[tuple[str, str]]:
    """(page and line, command line) for every fedrl command in a code block."""
    found = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text(encoding="utf-8")):
            for line in block.splitlines():
                if any(program in line for program in PROGRAMS):
                    found.append((f"{page.relative_to(ROOT)}: {line.strip()}", line))
    return found


def program_and_args(line: str) -> tuple[str, list[str]]:
    """The fedrl program a shell line runs, and its arguments up to the first shell operator."""
    words = shlex.split(line, comments=True)
    start = next(i for i, word in enumerate(words) if Path(word).name in PROGRAMS)
    args = []
    for word in words[start + 1 :]:
        if word in SHELL_OPERATORS:
            break
        args.append(word)
    return Path(words[start]).name, args


def test_the_pages_show_commands_of_both_programs() -> None:
    # act
    programs = {program_and_args(line)[0] for _, line in shown_commands()}

    # assert
    assert programs == set(PROGRAMS)


@pytest.mark.parametrize(("where", "line"), shown_commands(), ids=lambda value: value[:80])
def test_a_shown_command_parses(where: str, line: str) -> None:
    # prepare
    program, args = program_and_args(line)

    # act
    result = CliRunner().invoke(PROGRAMS[program], [*args, "--help"])

    # assert
    assert result.exit_code == 0, f"{where}\n{result.output}"
    assert "Usage:" in result.output
