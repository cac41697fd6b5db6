"""Config files: settings written as TOML come back unchanged, the command line wins over the
file, and anything wrong in a file is a clear error naming the file and the key, never a crash."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrl.client.commands.cli import main as client_main
from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.channel import ConnectionSecurity
from fedrl.client.training.engine import EngineConfig
from fedrl.client.training.learner import LearnerConfig
from fedrl.common.config_cli import Section, config_from_options, doc, section, takes_config
from fedrl.common.config_file import (
    ConfigFileError,
    config_to_toml,
    read_config_file,
    settings_from_toml,
)

# -- a config made for the test: every kind of field ---------------------------------------

OUTER = Section("outer", "Settings of the outer part.")


@dataclass(frozen=True)
class Inner:
    rate: float = field(default=0.5, metadata=doc("A rate."))
    clip: float | None = field(default=1.0, metadata=doc("A number that can be off."))
    derived: int = field(default=7, metadata=doc("Set by the command, never a setting."))

    def __post_init__(self) -> None:
        if self.rate < 0:
            raise ValueError(f"rate must be >= 0, got {self.rate}")


@dataclass(frozen=True)
class Sample:
    name: str = field(default="x", metadata=doc("Text.", section=OUTER))
    fast: bool = field(default=True, metadata=doc("A switch.", section=OUTER))
    mode: Literal["a", "b"] = field(default="a", metadata=doc("A choice.", section=OUTER))
    count: int = field(default=3, metadata=doc("An integer.", section=OUTER))
    steps: int | None = field(default=None, metadata=doc("An integer or none.", section=OUTER))
    widths: tuple[int, ...] = field(default=(4, 4), metadata=doc("Numbers.", section=OUTER))
    tags: tuple[str, ...] = field(default=(), metadata=doc("Texts.", section=OUTER))
    out: Path = field(default=Path("out"), metadata=doc("A path.", section=OUTER))
    where: Path | None = field(
        default=None, metadata=doc("An existing file.", path="file", exists=True, section=OUTER)
    )
    label: str | None = field(default=None, metadata=doc("Text or unset.", section=OUTER))
    inner: Inner = field(default_factory=Inner, metadata=section("Inner.", omit=("derived",)))


def from_file(cls: type, path: Path) -> Any:
    return config_from_options(cls, read_config_file(cls, path))


def test_every_kind_of_value_comes_back_from_its_file(tmp_path: Path) -> None:
    # prepare
    where = tmp_path / 'данные "quoted" file.txt'
    where.write_text("x", encoding="utf-8")
    config = Sample(
        name='Макар "the first"\\ \t李雷',
        fast=False,
        mode="b",
        count=-12,
        steps=None,
        widths=(8, 16, 32),
        tags=("a,b", "", "ü"),
        out=Path("relative/dir with space"),
        where=where,
        label=None,
        inner=Inner(rate=1e-7, clip=None),
    )
    path = tmp_path / "sample.toml"

    # act
    path.write_text(config_to_toml(config), encoding="utf-8")

    # assert
    assert from_file(Sample, path) == config


def test_a_written_file_holds_tables_by_section_and_help_as_comments() -> None:
    text = config_to_toml(Sample(steps=5))

    document = tomllib.loads(text)
    assert set(document) == {"outer", "inner"}
    assert document["outer"]["steps"] == 5
    assert document["inner"]["clip"] == 1.0
    assert "label" not in document["outer"]  # unset text is left out...
    assert "# label is not set" in text  # ...and says so
    assert "# A number that can be off." in text
    assert "derived" not in text  # not a setting: the command sets it


def test_a_number_switched_off_is_none_as_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "off.toml"
    path.write_text('[inner]\nclip = "none"\n[outer]\nsteps = "NONE"\n', encoding="utf-8")

    assert read_config_file(Sample, path) == {"clip": None, "steps": None}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[outer]\ncount = 1.5\n", "[outer] count = 1.5: expected an integer"),
        ("[outer]\ncount = true\n", "[outer] count = True: expected an integer"),
        ('[outer]\nfast = "yes"\n', "[outer] fast = 'yes': expected true or false"),
        ('[outer]\nmode = "c"\n', "[outer] mode = 'c': expected one of 'a', 'b'"),
        ('[outer]\nwidths = [1, "2"]\n', "expected an array of integers"),
        ('[outer]\nsteps = "off"\n', 'expected an integer or "none"'),
        ('[outer]\nwhere = "/no/such/file"\n', "[outer] where = '/no/such/file': file does"),
        ("[outer]\ncont = 1\n", "[outer] cont is not a setting; did you mean count (in [outer])"),
        ("[outer]\nrate = 1.0\n", "[outer] rate: rate belongs in [inner], not in [outer]"),
        ("count = 1\n", "count: count belongs in [outer], not at the top"),
        ("[elsewhere]\na = 1\n", "[elsewhere] is not a section of this command"),
        ("outer = 3\n", "outer is a section: write it as [outer]"),
        ("[outer]\ncount = [\n", "not valid TOML"),
        ("[outer]\nname = {a = 1}\n", "a table where a value belongs"),
        ("[inner]\nderived = 3\n", "[inner] derived is not a setting"),
    ],
)
def test_a_bad_file_is_an_error_naming_the_file_and_the_key(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")

    with pytest.raises(ConfigFileError) as refused:
        read_config_file(Sample, path)

    assert str(refused.value).startswith(f"{path}: ")
    assert says in str(refused.value)


def test_a_file_that_is_not_utf8_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[outer]\nname = "Müller"\n'.encode("latin-1"))

    with pytest.raises(ConfigFileError, match="not UTF-8 text"):
        read_config_file(Sample, path)


# -- the reader never crashes ---------------------------------------------------------------

KEYS = st.sampled_from(["outer", "inner", "name", "count", "rate", "clip", "widths", "x", "é"])
SCALARS = (
    st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.dates()
    | st.datetimes()
    | st.times()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS | st.text(max_size=5), VALUES, max_size=5))
def test_any_toml_document_gives_settings_or_a_clear_error(document: dict[str, Any]) -> None:
    try:
        found = settings_from_toml(Sample, document, source="doc.toml")
    except ConfigFileError as exc:
        assert str(exc).startswith("doc.toml: ")
    else:
        assert set(found) <= {f.name for f in dataclasses.fields(Sample)} | {"rate", "clip"}


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_give_settings_or_a_clear_error(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "any.toml"
    path.write_bytes(raw)

    try:
        read_config_file(Sample, path)
    except ConfigFileError as exc:
        assert str(exc).startswith(f"{path}: ")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"])))
def test_any_text_survives_the_writer(text: str) -> None:
    written = config_to_toml(Sample(name=text))

    assert tomllib.loads(written)["outer"]["name"] == text


# -- fedrl-client: the command line wins over the file, the file over the defaults -------


def printed(*args: str) -> TrainConfig:
    """The TrainConfig `fedrl-client ARGS --print-config` prints, read back."""
    result = CliRunner().invoke(client_main, [*args, "--print-config"])
    assert result.exit_code == 0, result.output
    document = tomllib.loads(result.output)
    return config_from_options(TrainConfig, settings_from_toml(TrainConfig, document, source="-"))


def test_a_run_from_its_file_equals_the_run_from_flags(tmp_path: Path) -> None:
    # prepare: flags of every kind, and the same settings as a file
    bundle_free = tmp_path / "ca.pem"
    bundle_free.write_text("not read until the run connects", encoding="utf-8")
    flags = [
        "--participant-id", "Макар", "--server", "example.org:7443", "--env", "Acrobot-v1",
        "--hidden", "32,16", "--huber-delta", "none", "--no-dueling", "--target-update",
        "polyak", "--share", "weights", "--sync-steps", "64", "--ca-cert", str(bundle_free),
        "--state-dir", str(tmp_path / "état dir"), "--episodes", "7",
    ]  # fmt: skip
    from_flags = printed(*flags)
    file = tmp_path / "run.toml"
    file.write_text(config_to_toml(from_flags), encoding="utf-8")

    # act
    from_config = printed("--config", str(file))

    # assert
    assert from_config == from_flags
    assert from_flags.participant_id == "Макар"
    assert from_flags.learner.hidden == (32, 16) and from_flags.learner.huber_delta is None
    assert from_flags.learner.target_update == "polyak" and from_flags.sync_steps == 64
    assert from_flags.tls == ConnectionSecurity(ca_cert=bundle_free)
    assert from_flags.engine.data is None and from_flags.delta_dtype is None


def test_the_command_line_wins_over_the_file_and_the_file_over_the_defaults(
    tmp_path: Path,
) -> None:
    file = tmp_path / "run.toml"
    file.write_text('[engine]\nenv = "Acrobot-v1"\nworkers = 3\n[learner]\nlr = 0.01\n')

    config = printed("--config", str(file), "--workers", "0")

    assert config.engine == EngineConfig(env="Acrobot-v1", workers=0)
    assert config.learner == LearnerConfig(lr=0.01)


def test_a_bad_file_stops_the_command_before_anything_is_written(tmp_path: Path) -> None:
    file = tmp_path / "run.toml"
    file.write_text('[run]\noffline = true\nparticipant_id = "a"\nepisodes = -1\n')
    state = tmp_path / "state"

    result = CliRunner().invoke(client_main, ["--config", str(file), "--state-dir", str(state)])

    assert result.exit_code == 2
    assert f"episodes must be >= 0, got -1 ([run] episodes in {file})" in result.output
    assert not state.exists()


def test_settings_of_the_other_algorithm_at_their_defaults_ask_for_nothing(
    tmp_path: Path,
) -> None:
    # A printed DQN run holds PPO's settings too, at their defaults: it runs as it is.
    file = tmp_path / "run.toml"
    file.write_text(config_to_toml(TrainConfig()), encoding="utf-8")
    assert printed("--config", str(file)) == TrainConfig()

    # One changed is asked for, and refused where it cannot act.
    changed = tmp_path / "ppo.toml"
    changed.write_text("[ppo]\nepochs = 3\n", encoding="utf-8")
    result = CliRunner().invoke(client_main, ["--config", str(changed)])
    assert result.exit_code == 2
    assert (
        f"--epochs set PPO's learner: add --algo ppo, or drop them ([ppo] epochs in {changed})"
        in (result.output)
    )


def test_a_required_setting_may_come_from_the_file(tmp_path: Path) -> None:
    @dataclass(frozen=True)
    class Needs:
        goal: int = field(metadata=doc("Required."))

    seen: list[Needs] = []

    @click.command()
    @takes_config(Needs, config_file=True)
    def needs(config: Needs) -> None:
        seen.append(config)

    file = tmp_path / "needs.toml"
    file.write_text("goal = 5\n", encoding="utf-8")

    assert CliRunner().invoke(needs, ["--config", str(file)]).exit_code == 0
    missing = CliRunner().invoke(needs, [])
    assert seen == [Needs(goal=5)]
    assert missing.exit_code == 2 and "Missing option '--goal'" in missing.output


def test_fedrl_client_config_prints_what_runs_the_recorded_configuration_again(
    tmp_path: Path,
) -> None:
    # prepare: a state dir that recorded a configuration with every kind of value
    token = tmp_path / "tökén"
    token.write_text("secret", encoding="utf-8")
    rich = dataclasses.replace(
        TrainConfig(
            participant_id="Макар 李雷",
            server="[::1]:7443",
            share="experience",
            delta_dtype="float16",
            round_wait_s=0.0,
            state_dir=tmp_path / "state dirs",
        ),
        learner=LearnerConfig(hidden=(128, 64, 32), grad_clip_norm=None, target_update="polyak"),
        tls=ConnectionSecurity(ca_cert=token, token_file=token),
    )
    where = rich.state_dir / rich.participant_id
    where.mkdir(parents=True)
    (where / "config.toml").write_text(config_to_toml(rich), encoding="utf-8")

    # act: print it, and run (as far as --print-config) from what was printed
    shown = CliRunner().invoke(client_main, ["config", "--state-dir", str(rich.state_dir)])
    file = tmp_path / "again.toml"
    file.write_text(shown.output, encoding="utf-8")
    again = printed("--config", str(file))

    # assert
    assert shown.exit_code == 0, shown.output
    assert again == rich
