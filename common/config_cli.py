"""Command-line options from a frozen config dataclass: how every fedrl command gets its options.

Each command (fedrl-client's training, plot, check, export and backtest; fedrl-server's serve,
status, raise-goal, init-tls, issue and revoke) declares its knobs as the fields of one frozen
dataclass. A field's metadata holds its help text (`doc`); a field whose type is itself a
config dataclass is a section (`section`), and its fields become options of the command
without being declared again, so a group such as the TLS options is written once and used by
every command that needs it. Nothing here reads source code: the commands work the same from
an installed wheel that ships bytecode only.

How a field becomes an option, the same for every command:

- the option is `--field-name` (underscores become dashes), unless `doc(flag=...)` names another;
- bool: a `--name/--no-name` pair; bool | None: the same, None when neither is given;
- Literal["a", "b"]: one of those values;
- int | None and float | None: a number, or `none` to switch the knob off;
- str | None and Path | None: None when the option is left out;
- tuple[int, ...]: one comma-separated value, `--hidden 256,256`;
- tuple[str, ...]: the option given once per value (a value may hold commas);
- Path, or str with `doc(path=...)`: a path; `exists=True` has it checked before the command runs;
- a field without a default: a required option.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import click
from click.core import ParameterSource

C = TypeVar("C")
R = TypeVar("R")

_KEY = "fedrl.cli"
"""The metadata key of a field's command-line declaration."""

PathKind = Literal["file", "dir"]


@dataclass(frozen=True)
class _Doc:
    help: str
    flag: str | None
    path: PathKind | None
    exists: bool


@dataclass(frozen=True)
class _Section:
    help: str
    omit: frozenset[str]


def doc(
    help: str,
    *,
    flag: str | None = None,
    path: PathKind | None = None,
    exists: bool = False,
) -> dict[str, Any]:
    """Field metadata: the option's help text and, where the default does not fit, its flag,
    what kind of path it takes, and whether that path must exist."""
    return {_KEY: _Doc(" ".join(help.split()), flag, path, exists)}


def section(help: str, *, omit: Iterable[str] = ()) -> dict[str, Any]:
    """Field metadata of a nested config: its fields become options, except those in `omit`,
    which keep their defaults (the command sets them, or derives them)."""
    return {_KEY: _Section(" ".join(help.split()), frozenset(omit))}


@dataclass(frozen=True)
class ConfigOption:
    """One command-line option and the config field it fills."""

    name: str
    """The field's name, which is also the option's parameter name."""
    hint: Any
    default: Any
    """The field's default; dataclasses.MISSING for a required option."""
    help: str
    flag: str
    path: PathKind | None
    exists: bool

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


def config_options(cls: type) -> list[ConfigOption]:
    """Every option of a command's config, sections expanded in place, in field order.

    TypeError (at import, where the command is declared) for a field without help text, a
    type with no command-line form, or two fields that would share an option name.
    """
    found = list(_walk(cls))
    seen: dict[str, ConfigOption] = {}
    for option in found:
        for key in (option.name, option.flag):
            if key in seen:
                raise TypeError(f"{cls.__name__}: two fields would be option {key!r}; rename one")
            seen[key] = option
    return found


def _walk(cls: type, omit: frozenset[str] = frozenset()) -> Iterator[ConfigOption]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(_KEY)
        if isinstance(declared, _Section):
            inner = hints[f.name]
            if f.default_factory not in (inner, dataclasses.MISSING):
                raise TypeError(
                    f"{cls.__name__}.{f.name}: a section defaults to its own class's defaults "
                    "(default_factory=the class), or has none"
                )
            yield from _walk(inner, declared.omit)
        elif f.name in omit:
            continue
        elif isinstance(declared, _Doc):
            yield ConfigOption(
                name=f.name,
                hint=hints[f.name],
                default=_default(f),
                help=declared.help,
                flag=declared.flag or "--" + f.name.replace("_", "-"),
                path=declared.path,
                exists=declared.exists,
            )
        else:
            raise TypeError(
                f"{cls.__name__}.{f.name} has no help text: declare it with "
                "field(..., metadata=doc('...')) or, for a nested config, section('...')"
            )


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def config_from_options(cls: type[C], values: Mapping[str, Any]) -> C:
    """The config from option values named by field; a field with no value keeps its default.

    ValueError from the config (or a section of it) says which value is wrong.
    """
    return _build(cls, values, frozenset())


def _build(cls: type[C], values: Mapping[str, Any], omit: frozenset[str]) -> C:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        declared = f.metadata.get(_KEY)
        if isinstance(declared, _Section):
            kwargs[f.name] = _build(hints[f.name], values, declared.omit)
        elif f.name in values and f.name not in omit:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def takes_config(cls: type[C]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Adds one option per field of `cls` to a click command, and calls the command with
    `config=`, the config built from them. A value the config refuses is a usage error."""
    options = config_options(cls)
    names = [option.name for option in options]

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(command)
        def with_config(*args: Any, **kwargs: Any) -> R:
            values = {name: kwargs.pop(name) for name in names}
            try:
                config = config_from_options(cls, values)
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
            return command(*args, config=config, **kwargs)

        decorated: Callable[..., R] = with_config
        for option in reversed(options):
            decorated = click_option(option)(decorated)
        return decorated

    return decorate


def click_option(option: ConfigOption) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """The click option of one config field."""
    settings: dict[str, Any] = {"help": option.help}
    if option.required:
        settings["required"] = True
    else:
        settings["default"] = _shown(option.default)
        settings["show_default"] = option.default not in ("", None, ())
    names = [option.flag]
    hint = _without_none(option.hint)
    if hint is bool:
        names = [f"{option.flag}/--no-{option.flag[2:]}"]
    elif typing.get_origin(hint) is tuple and typing.get_args(hint) == (str, ...):
        settings["multiple"] = True
    else:
        settings["type"] = _click_type(option)
    return click.option(*names, option.name, **settings)


def _without_none(hint: Any) -> Any:
    """The type inside `X | None`; any other hint as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return hint


def _click_type(option: ConfigOption) -> click.ParamType[Any]:
    hint = _without_none(option.hint)
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


def refuse_options_before_a_command(ctx: click.Context, cls: type) -> None:
    """For a group whose own options are `cls`'s (they run it without a command): refuse them
    given before a command's name, where they would otherwise be silently ignored."""
    given = [
        option.flag
        for option in config_options(cls)
        if ctx.get_parameter_source(option.name)
        in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    ]
    if given:
        raise click.UsageError(
            f"{', '.join(given)} before `{ctx.invoked_subcommand}`: those are options of "
            f"{ctx.command_path} without a command; give the command's own options after its name"
        )
