"""A command's settings, read off its frozen config dataclass: each field's help, flag and section.

Each command declares its knobs as the fields of one frozen dataclass. A field's metadata
holds its help text (`doc`); a field whose type is itself a config dataclass is a nested
config (`section`), whose fields are settings of the command too, without being declared
again. Every setting belongs to one Section: the one its `doc(section=...)` names, else the
nested config it sits in (named by that field), else none (the command's own top level).
Sections are the headings of the command's help and the tables of its config file
(fedrl.common.config_cli, fedrl.common.config_file). Nothing here reads source code: the
commands work the same from an installed wheel that ships bytecode only.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

C = TypeVar("C")

KEY = "fedrl.cli"
"""The metadata key of a field's declaration."""

PathKind = Literal["file", "dir"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True)
class Section:
    """A named part of a command's settings: a heading of its help, a table of its config file."""

    name: str
    """A bare TOML key (letters, digits, underscores); "" for the command's top level."""
    help: str


TOP = Section("", "")
"""Where a setting of no section lives: the top of the config file, "Options" in the help."""


@dataclass(frozen=True)
class _Doc:
    help: str
    flag: str | None
    path: PathKind | None
    exists: bool
    section: Section | None


@dataclass(frozen=True)
class _Nested:
    help: str
    omit: frozenset[str]


def doc(
    help: str,
    *,
    flag: str | None = None,
    path: PathKind | None = None,
    exists: bool = False,
    section: Section | None = None,
) -> dict[str, Any]:
    """Field metadata: the setting's help text and, where the default does not fit, its flag,
    what kind of path it takes, whether that path must exist, and its section."""
    return {KEY: _Doc(" ".join(help.split()), flag, path, exists, section)}


def section(help: str, *, omit: Iterable[str] = ()) -> dict[str, Any]:
    """Field metadata of a nested config, a section named by the field: its fields become
    settings, except those in `omit`, which keep their defaults (the command sets them, or
    derives them)."""
    return {KEY: _Nested(" ".join(help.split()), frozenset(omit))}


@dataclass(frozen=True)
class ConfigOption:
    """One setting of a command and the config field it fills."""

    name: str
    """The field's name: the option's parameter name and the config file's key."""
    hint: Any
    default: Any
    """The field's default; dataclasses.MISSING for a required setting."""
    help: str
    flag: str
    path: PathKind | None
    exists: bool
    section: Section
    at: tuple[str, ...]
    """Attribute names from the command's config to the value: ("engine", "env")."""

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    def value(self, config: object) -> Any:
        """This setting's value in a config of the command."""
        return functools.reduce(getattr, self.at, config)


def config_options(cls: type) -> list[ConfigOption]:
    """Every setting of a command's config, nested configs expanded in place, in field order.

    TypeError (at import, where the command is declared) for a field without help text, two
    fields that would share an option name, or two sections of one name and different help.
    """
    found = list(_walk(cls, frozenset(), TOP, ()))
    seen: dict[str, ConfigOption] = {}
    sections: dict[str, Section] = {}
    for option in found:
        for key in (option.name, option.flag):
            if key in seen:
                raise TypeError(f"{cls.__name__}: two fields would be option {key!r}; rename one")
            seen[key] = option
        known = sections.setdefault(option.section.name, option.section)
        if known != option.section:
            raise TypeError(
                f"{cls.__name__}: two sections are named {known.name!r} with different help"
            )
    for name in sections:
        if name and not _BARE_KEY.fullmatch(name):
            raise TypeError(f"{cls.__name__}: section name {name!r} is not a bare TOML key")
        if name in seen and seen[name].section == TOP:
            raise TypeError(f"{cls.__name__}: {name!r} names a section and a top-level setting")
    return found


def config_sections(cls: type) -> list[tuple[Section, list[ConfigOption]]]:
    """The settings of a command's config by section, sections in order of first appearance."""
    grouped: dict[Section, list[ConfigOption]] = {}
    for option in config_options(cls):
        grouped.setdefault(option.section, []).append(option)
    return list(grouped.items())


def _walk(
    cls: type, omit: frozenset[str], within: Section, at: tuple[str, ...]
) -> Iterator[ConfigOption]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(KEY)
        if isinstance(declared, _Nested):
            inner = hints[f.name]
            if f.default_factory not in (inner, dataclasses.MISSING):
                raise TypeError(
                    f"{cls.__name__}.{f.name}: a section defaults to its own class's defaults "
                    "(default_factory=the class), or has none"
                )
            yield from _walk(inner, declared.omit, Section(f.name, declared.help), (*at, f.name))
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
                section=declared.section or within,
                at=(*at, f.name),
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
    """The config from setting values named by field; a field with no value keeps its default.

    ValueError from the config (or a nested config of it) says which value is wrong.
    """
    return _build(cls, values, frozenset())


def _build(cls: type[C], values: Mapping[str, Any], omit: frozenset[str]) -> C:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        declared = f.metadata.get(KEY)
        if isinstance(declared, _Nested):
            kwargs[f.name] = _build(hints[f.name], values, declared.omit)
        elif f.name in values and f.name not in omit:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def without_none(hint: Any) -> Any:
    """The type inside `X | None`; any other hint as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return hint


def first_sentence(text: str) -> str:
    """The text up to its first sentence's full stop: a help text's gist. A stop ends a
    sentence where a capital letter follows and no abbreviation (e.g., et al.) precedes it."""
    for match in _SENTENCE_END.finditer(text):
        if not text[: match.start()].endswith(_ABBREVIATIONS):
            return text[: match.start() + 1]
    return text


_SENTENCE_END = re.compile(r"\.\s+(?=[A-Z])")
_ABBREVIATIONS = ("e.g", "i.e", "et al", "cf", "vs", "etc")
