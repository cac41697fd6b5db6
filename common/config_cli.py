"""Command-line options from a frozen config dataclass: how every fedrl command gets its options.

Each command (fedrl-client's training, plot, check, export and backtest; fedrl-server's serve,
status, raise-goal, init-tls, issue and revoke) declares its knobs as the fields of one frozen
dataclass (fedrl.common.config_fields: `doc` for a field, `section` for a nested config, whose
fields become options of the command without being declared again). `takes_config` turns them
into options, and can add `--config FILE`, a TOML file of the same settings
(fedrl.common.config_file), and help by section (fedrl.common.config_help).

How a field becomes an option, the same for every command:

- the option is `--field-name` (underscores become dashes), unless `doc(flag=...)` names another;
- bool: a `--name/--no-name` pair;
- Literal["a", "b"]: one of those values;
- int | None and float | None: a number, or `none` to switch the knob off;
- str | None and Path | None: None when the option is left out;
- tuple[int, ...]: one comma-separated value, `--hidden 256,256`;
- tuple[str, ...]: the option given once per value (a value may hold commas);
- Path, or str with `doc(path=...)`: a path; `exists=True` has it checked before the command runs;
- a field without a default: a required option.

Where a value comes from: the command line wins over the config file, the file over the
field's default.
"""

from __future__ import annotations

import functools
import re
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import click
from click.core import ParameterSource

from fedrl.common.config_fields import (
    TOP,
    ConfigOption,
    Section,
    config_from_options,
    config_options,
    config_sections,
    doc,
    section,
    without_none,
)
from fedrl.common.config_file import ConfigFileError, read_config_file
from fedrl.common.config_help import FieldOption, help_options

__all__ = [
    "ConfigOption",
    "Explicit",
    "Section",
    "config_from_options",
    "config_options",
    "doc",
    "explicit_settings",
    "print_config_option",
    "refuse_options_before_a_command",
    "section",
    "takes_config",
]
"""doc and section are here too: every config declares its fields through this module."""

C = TypeVar("C")
R = TypeVar("R")

CONFIG_FILE = "config_file"
"""The parameter name of --config (never a field's: `config` is what the command receives)."""
_EXPLICIT = "fedrl.explicit"
"""ctx.meta key: the settings given on the command line or in the config file."""
_TYPED = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def takes_config(
    cls: type[C], *, common: Collection[str] = (), config_file: bool = False
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Adds one option per field of `cls` to a click command, and calls the command with
    `config=`, the config built from them. A value the config refuses is a usage error.

    `common` names the fields whose options the short `--help` shows; with any, or with
    several sections, the command also gets --help-all and --help-section (use
    ConfigCommand or ConfigGroup as its class for the help by section). `config_file` adds
    `--config FILE`, whose settings the command line overrides (fedrl.common.config_file).
    """
    options = config_options(cls)
    names = [option.name for option in options]
    unknown = set(common) - set(names)
    if unknown:
        raise TypeError(f"{cls.__name__}: common names no field {sorted(unknown)}")
    if config_file and CONFIG_FILE in names:
        raise TypeError(f"{cls.__name__}: a field named {CONFIG_FILE!r} would shadow --config")
    sections = [part.name for part, _ in config_sections(cls) if part != TOP]

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(command)
        def with_config(*args: Any, **kwargs: Any) -> R:
            ctx = click.get_current_context()
            values = {name: kwargs.pop(name) for name in names}
            path: Path | None = kwargs.pop(CONFIG_FILE) if config_file else None
            typed = {
                name: values[name] for name in names if ctx.get_parameter_source(name) in _TYPED
            }
            try:
                from_file = {} if path is None else read_config_file(cls, path)
            except ConfigFileError as exc:
                raise click.BadParameter(str(exc), ctx, param_hint="'--config'") from None
            chosen = {**from_file, **typed}
            if config_file:
                _check_required(options, chosen)
            explicit = Explicit(frozenset(typed), from_file, path, tuple(options))
            ctx.meta[_EXPLICIT] = explicit
            try:
                config = config_from_options(cls, chosen)
            except ValueError as exc:
                raise click.UsageError(explicit.blamed(str(exc))) from None
            return command(*args, config=config, **kwargs)

        decorated: Callable[..., R] = with_config
        for option in reversed(options):
            decorated = click_option(
                option, common=option.name in common, file_may_give=config_file
            )(decorated)
        if common or len(sections) > 1:
            for extra in reversed(help_options(sections)):
                decorated = extra(decorated)
        if config_file:
            decorated = click.option(
                "--config",
                CONFIG_FILE,
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                help="TOML file of settings, in tables by section as `--help-all` shows them "
                "(the command line wins over it).",
            )(decorated)
        return decorated

    return decorate


print_config_option = click.option(
    "--print-config",
    is_flag=True,
    help="Print the settings these options give, as a file for --config, and exit.",
)
"""The option of a command that takes a config file and can print its settings instead."""


@dataclass(frozen=True)
class Explicit:
    """The settings a takes_config command was given, on its command line or in its file."""

    typed: frozenset[str]
    """Given on the command line (or in the environment)."""
    from_file: Mapping[str, Any]
    """Given in the config file, with their values."""
    path: Path | None
    """The config file."""
    options: tuple[ConfigOption, ...]

    @property
    def names(self) -> frozenset[str]:
        """Every setting given, which therefore keeps its value (no game's defaults apply)."""
        return self.typed | frozenset(self.from_file)

    @property
    def changed(self) -> frozenset[str]:
        """The settings asked for: typed, or in the file at another value than the default.

        A file printed from a run holds every setting, those the run never read included;
        one at its default asks for nothing.
        """
        defaults = {option.name: option.default for option in self.options}
        return self.typed | frozenset(
            name for name, value in self.from_file.items() if value != defaults[name]
        )

    def blamed(self, message: str) -> str:
        """A refusal of the settings, with where in the config file the ones it names were set."""
        named = [
            o
            for o in self.options
            if o.name in self.from_file
            and o.name not in self.typed
            and re.search(rf"(?<![\w-])({re.escape(o.name)}|{re.escape(o.flag)})(?![\w-])", message)
        ]
        if not named:
            return message
        keys = ", ".join(
            f"[{o.section.name}] {o.name}" if o.section.name else o.name for o in named
        )
        return f"{message} ({keys} in {self.path})"


def explicit_settings(ctx: click.Context) -> Explicit:
    """What a takes_config command was given (the rest keep their defaults)."""
    explicit = ctx.meta.get(_EXPLICIT)
    if not isinstance(explicit, Explicit):
        raise RuntimeError(f"{ctx.command_path} does not take a config")
    return explicit


def _check_required(options: list[ConfigOption], chosen: Mapping[str, Any]) -> None:
    """For a command with a config file, where click cannot tell: every required setting."""
    missing = [o.flag for o in options if o.required and o.name not in chosen]
    if missing:
        raise click.UsageError(
            f"Missing option {', '.join(repr(m) for m in missing)}: give it on the command "
            "line or in the --config file"
        )


def click_option(
    option: ConfigOption, *, common: bool = False, file_may_give: bool = False
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """The click option of one config field; `file_may_give`: a required field may come from
    the config file instead, so the command line need not give it."""
    settings: dict[str, Any] = {"help": option.help, "section": option.section, "common": common}
    if option.required:
        settings["required"] = not file_may_give
    else:
        settings["default"] = _shown(option.default)
        # A switch that is off says so by its help; "[default: no-offline]" adds nothing.
        settings["show_default"] = option.default not in ("", None, (), False)
    names = [option.flag]
    hint = without_none(option.hint)
    if option.hint is bool:
        names = [f"{option.flag}/--no-{option.flag[2:]}"]
    elif typing.get_origin(hint) is tuple and typing.get_args(hint) == (str, ...):
        settings["multiple"] = True
    else:
        settings["type"] = _click_type(option)
    return click.option(*names, option.name, cls=FieldOption, **settings)


def _click_type(option: ConfigOption) -> click.ParamType[Any]:
    hint = without_none(option.hint)
    optional = hint is not option.hint
    if option.path is not None or hint is Path:
        if hint not in (Path, str):
            raise TypeError(f"{option.flag}: a path field is Path or str, not {hint!r}")
        return click.Path(
            path_type=hint,
            exists=option.exists,
            file_okay=option.path != "dir",
            dir_okay=option.path != "file",
        )
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if not all(isinstance(choice, str) for choice in choices):
            raise TypeError(f"{option.flag}: only Literals of strings become choices")
        return click.Choice(choices)
    if typing.get_origin(hint) is tuple and typing.get_args(hint) == (int, ...):
        return IntList()
    basic: dict[Any, click.ParamType[Any]] = {int: click.INT, float: click.FLOAT, str: click.STRING}
    if hint in basic:
        # Text left out is None already; a number that can be off takes "none".
        return NoneOr(basic[hint]) if optional and hint is not str else basic[hint]
    raise TypeError(f"{option.flag}: no command-line form for {option.hint!r}")


def _shown(default: Any) -> Any:
    # Click reads a tuple default as several values, but a list of numbers is one
    # comma-separated value; a repeated option (tuple of text) keeps its tuple.
    if isinstance(default, tuple) and default and all(isinstance(d, int) for d in default):
        return ",".join(str(d) for d in default)
    return default


class IntList(click.ParamType[Any]):
    """Comma-separated integers such as 256,256, as a tuple."""

    name = "INTS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        try:
            return tuple(int(part) for part in str(value).split(",") if part.strip())
        except ValueError:
            self.fail(f"expected comma-separated integers such as 256,256, got {value!r}")


class NoneOr(click.ParamType[Any]):
    """A value of the inner type, or "none" for a knob that is switched off."""

    def __init__(self, inner: click.ParamType[Any]) -> None:
        self.inner = inner
        self.name = f"{inner.name}|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        return self.inner.convert(value, param, ctx)


def refuse_options_before_a_command(ctx: click.Context) -> None:
    """For a group whose own options run it without a command: refuse them given before a
    command's name, where they would otherwise be silently ignored."""
    given = [
        param.opts[0]
        for param in ctx.command.params
        if param.name is not None and ctx.get_parameter_source(param.name) in _TYPED
    ]
    if given:
        raise click.UsageError(
            f"{', '.join(given)} before `{ctx.invoked_subcommand}`: those are options of "
            f"{ctx.command_path} without a command; give the command's own options after its name"
        )
