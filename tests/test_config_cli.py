"""Options from config dataclasses: the conventions, every command's options against its config,
and the commands working from bytecode alone, as an installed wheel may ship them."""

from __future__ import annotations

import compileall
import dataclasses
import os
import shutil
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import click
import pytest
from click.testing import CliRunner

from fedrl.client.commands.backtest import BacktestConfig, backtest
from fedrl.client.commands.check.command import check_command
from fedrl.client.commands.check.config import CheckConfig
from fedrl.client.commands.cli import main as client_main
from fedrl.client.commands.config import TrainConfig
from fedrl.client.commands.export import ExportConfig, export_command
from fedrl.client.commands.plot import PlotConfig, plot_command
from fedrl.client.commands.record import RecordConfig, record_command
from fedrl.client.commands.show_config import ShowConfig, config_command
from fedrl.common.config_cli import doc, section, takes_config
from fedrl.common.config_help import FieldOption
from fedrl.server.cli import (
    RaiseGoalConfig,
    ServeConfig,
    ShowServeConfig,
    StatusConfig,
    raise_goal_command,
    serve_command,
    status_command,
)
from fedrl.server.cli import config_command as server_config_command
from fedrl.server.cli import main as server_main
from fedrl.server.security.tls_commands import (
    InitTlsConfig,
    IssueConfig,
    RevokeConfig,
    init_tls,
    issue,
    revoke,
)

ROOT = Path(__file__).resolve().parents[1]

# -- the conventions, on a config made for the test --------------------------------------


@dataclass(frozen=True)
class Inner:
    rate: float = field(default=0.5, metadata=doc("A rate."))
    derived: int = field(default=7, metadata=doc("Set by the command, never an option."))

    def __post_init__(self) -> None:
        if self.rate < 0:
            raise ValueError(f"rate must be >= 0, got {self.rate}")


@dataclass(frozen=True)
class Sample:
    name: str = field(metadata=doc("Required: no default."))
    fast: bool = field(default=True, metadata=doc("A switch."))
    mode: Literal["a", "b"] = field(default="a", metadata=doc("A choice."))
    clip: float | None = field(default=1.0, metadata=doc("A number that can be off."))
    widths: tuple[int, ...] = field(default=(4, 4), metadata=doc("Numbers in one value."))
    tags: tuple[str, ...] = field(default=(), metadata=doc("Repeated.", flag="--tag"))
    where: Path | None = field(default=None, metadata=doc("A file.", path="file", exists=True))
    inner: Inner = field(default_factory=Inner, metadata=section("A section.", omit=("derived",)))


@click.command()
@takes_config(Sample)
def sample(config: Sample) -> None:
    click.echo(repr(config))


def parsed(*args: str) -> Sample:
    seen: list[Sample] = []

    @click.command()
    @takes_config(Sample)
    def capture(config: Sample) -> None:
        seen.append(config)

    result = CliRunner().invoke(capture, list(args))
    assert result.exit_code == 0, result.output
    return seen[0]


def test_defaults_fill_every_field_but_the_required_one() -> None:
    assert parsed("--name", "x") == Sample(name="x")


def test_every_bool_is_a_flag_pair() -> None:
    assert parsed("--name", "x", "--no-fast").fast is False
    assert parsed("--name", "x", "--fast").fast is True


def test_values_of_each_kind_are_converted(tmp_path: Path) -> None:
    where = tmp_path / "file.txt"
    where.write_text("x", encoding="utf-8")

    config = parsed(
        "--name", "Макар", "--mode", "b", "--clip", "none", "--widths", "8,16",
        "--tag", "a,b", "--tag", "c", "--where", str(where), "--rate", "2.5",
    )  # fmt: skip

    assert config == Sample(
        name="Макар",
        mode="b",
        clip=None,
        widths=(8, 16),
        tags=("a,b", "c"),
        where=where,
        inner=Inner(rate=2.5),
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "Missing option '--name'"),
        (["--name", "x", "--mode", "c"], "'c' is not one of 'a', 'b'"),
        (["--name", "x", "--widths", "4,x"], "comma-separated integers"),
        (["--name", "x", "--where", "/no/such/file"], "does not exist"),
        (["--name", "x", "--rate", "-1"], "rate must be >= 0"),
        (["--name", "x", "--derived", "3"], "No such option '--derived'"),
    ],
)
def test_a_bad_value_is_a_usage_error_that_names_it(args: list[str], says: str) -> None:
    result = CliRunner().invoke(sample, args)

    assert result.exit_code == 2
    assert says in result.output


def test_a_field_without_help_text_is_refused_where_the_command_is_declared() -> None:
    @dataclass(frozen=True)
    class Undocumented:
        knob: int = 3

    with pytest.raises(TypeError, match=r"Undocumented\.knob has no help text"):
        takes_config(Undocumented)


def test_two_fields_with_one_option_name_are_refused() -> None:
    @dataclass(frozen=True)
    class Twice:
        rate: float = field(default=1.0, metadata=doc("Again."))
        inner: Inner = field(default_factory=Inner, metadata=section("A section."))

    with pytest.raises(TypeError, match="'rate'"):
        takes_config(Twice)


# -- every command against its config ----------------------------------------------------

COMMANDS: dict[str, tuple[click.Command, type, set[tuple[str, str]]]] = {
    # name: (command, its config, (section, field) pairs the command sets itself)
    "fedrl-client": (
        client_main,
        TrainConfig,
        {("learner", "seed"), ("ppo", "seed"), ("ppo", "device"), ("ppo", "amp")},
    ),
    "fedrl-client config": (config_command, ShowConfig, set()),
    "fedrl-client plot": (plot_command, PlotConfig, set()),
    "fedrl-client check": (check_command, CheckConfig, {("tls", "token_file")}),
    "fedrl-client export": (export_command, ExportConfig, set()),
    "fedrl-client record": (record_command, RecordConfig, set()),
    "fedrl-client backtest": (
        backtest,
        BacktestConfig,
        {("trading", "split"), ("trading", "episode_length")},
    ),
    "fedrl-server": (server_main, ServeConfig, set()),
    "fedrl-server serve": (serve_command, ServeConfig, set()),
    "fedrl-server config": (server_config_command, ShowServeConfig, set()),
    "fedrl-server status": (status_command, StatusConfig, set()),
    "fedrl-server raise-goal": (raise_goal_command, RaiseGoalConfig, set()),
    "fedrl-server init-tls": (init_tls, InitTlsConfig, set()),
    "fedrl-server issue": (issue, IssueConfig, set()),
    "fedrl-server revoke": (revoke, RevokeConfig, set()),
}
RENAMED = {
    "model_path": "--model",
    "env_id": "--env",
    "as_json": "--json",
    "hosts": "--host",
    "as_token": "--token",
}
"""Fields whose option keeps the name users know rather than the field's."""


def expected_fields(
    cls: type, omitted: set[tuple[str, str]], at: str = ""
) -> list[dataclasses.Field[Any]]:
    """The fields that should be options: nested configs expanded, omitted ones left out."""
    hints = typing.get_type_hints(cls)
    found: list[dataclasses.Field[Any]] = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            found += expected_fields(hints[f.name], omitted, f.name)
        elif (at, f.name) not in omitted:
            found.append(f)
    return found


@pytest.mark.parametrize("name", list(COMMANDS))
def test_options_and_config_fields_match_one_to_one(name: str) -> None:
    # prepare
    command, config, omitted = COMMANDS[name]
    fields = {f.name: f for f in expected_fields(config, omitted)}
    ctx = click.Context(command)

    # act
    options = {p.name: p for p in command.params if isinstance(p, FieldOption)}

    # assert
    assert set(options) == set(fields)
    for field_name, f in fields.items():
        option = options[field_name]
        flag = RENAMED.get(field_name, "--" + field_name.replace("_", "-"))
        assert option.opts == [flag], field_name
        assert option.help, f"{flag} has no help text"
        if f.type == "bool":
            assert option.secondary_opts == ["--no-" + flag[2:]], field_name
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            assert option.required, field_name
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert option.type_cast_value(ctx, option.get_default(ctx)) == default, field_name


def test_every_command_of_both_programs_is_checked() -> None:
    listed = {
        f"{program} {sub}".strip()
        for program, group in (("fedrl-client", client_main), ("fedrl-server", server_main))
        for sub in ["", *group.commands]  # type: ignore[attr-defined]
    }

    assert listed == set(COMMANDS)


# -- no sources at hand ------------------------------------------------------------------

SOURCELESS_CHECK = """
import inspect, sys
# Forget the editable install: fedrl must come from the bytecode-only copy.
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in str(f)]
site = sys.argv[1]
from click.testing import CliRunner
from fedrl.client.commands import cli as client
from fedrl.client.commands.config import TrainConfig
from fedrl.server import cli as server
assert client.__file__.startswith(site) and client.__file__.endswith(".pyc"), client.__file__
try:
    inspect.getsource(TrainConfig)
except OSError:
    pass
else:
    sys.exit("the source of TrainConfig is readable: the check would prove nothing")
for main, commands in ((client.main, client.main.commands), (server.main, server.main.commands)):
    for args in ([], *([name] for name in commands)):
        result = CliRunner().invoke(main, [*args, "--help"])
        assert result.exit_code == 0 and "--" in result.output, (args, result.output)
print("ok")
"""


def test_commands_work_from_bytecode_without_python_sources(tmp_path: Path) -> None:
    # prepare: the installed layout (fedrl/<package>), compiled, every .py removed
    site = tmp_path / "site"
    packages = {
        "server": ROOT / "server",
        "client": ROOT / "client",
        "common": ROOT / "common",
        "envs": ROOT / "envs",
        "proto": ROOT / "proto" / "fedrl",
    }
    for name, source in packages.items():
        shutil.copytree(source, site / "fedrl" / name, ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(site, quiet=1, legacy=True)
    for source in site.rglob("*.py"):
        source.unlink()

    # act
    result = subprocess.run(
        [sys.executable, "-c", SOURCELESS_CHECK, str(site)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(site)},
    )

    # assert
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "ok"
