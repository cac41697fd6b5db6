"""Config files: a command's settings as TOML, read with the standard library's tomllib.

A file holds the settings the command line takes, each under its config field's name, in the
table of its section (`[run]`, `[engine]`, ...: the sections of the command's help; a command
without sections takes its keys at the top). The values are TOML's own types: text, integers,
floats, booleans, arrays (`hidden = [256, 256]`, `session_strategy = ["a=median"]`); a path is
text, relative to the current directory as on the command line; a number that can be switched
off is "none", as on the command line; an unset text or path is left out. Everything a file
says is checked before anything runs: an unknown table or key, a wrong type, a missing path
or a value the config refuses is an error naming the file and the key.

`config_to_toml` writes a config back as such a file (what `fedrl-client config` and
`--print-config` print). We write it ourselves rather than with tomli-w: the values are a
handful of plain types, and every key gets its help as a comment above it, so a printed
configuration explains itself; tomli-w writes no comments.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import textwrap
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from fedrl.common.config_fields import (
    TOP,
    ConfigOption,
    config_options,
    config_sections,
    first_sentence,
    without_none,
)

COMMENT_WIDTH = 88
"""Width of the help comments a written config file carries."""
NONE = "none"
"""The value of a number that is switched off, in a file as on the command line."""


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message names the file and, where one is at
    fault, the key."""


def read_config_file(cls: type, path: Path) -> dict[str, Any]:
    """The settings a config file gives `cls`'s command, by field name, each converted to its
    field's type; ConfigFileError for anything the file gets wrong."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); TOML files are UTF-8"
        ) from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: not valid TOML: {exc}") from None
    return settings_from_toml(cls, document, source=str(path))


def settings_from_toml(cls: type, document: Mapping[str, Any], *, source: str) -> dict[str, Any]:
    """The settings of a parsed TOML document, by field name (see read_config_file)."""
    options = config_options(cls)
    by_name = {option.name: option for option in options}
    tables = {option.section.name for option in options if option.section != TOP}
    found: dict[str, Any] = {}
    for key, value in document.items():
        if key in tables:
            if not isinstance(value, dict):
                raise ConfigFileError(f"{source}: {key} is a section: write it as [{key}]")
            for inner, inner_value in value.items():
                found[inner] = _setting(
                    by_name, tables, table=key, key=inner, value=inner_value, source=source
                )
        elif isinstance(value, dict) and key not in by_name:
            listed = ", ".join(f"[{name}]" for name in sorted(tables)) or "none"
            raise ConfigFileError(
                f"{source}: [{key}] is not a section of this command (its sections: {listed})"
            )
        else:
            found[key] = _setting(by_name, tables, table="", key=key, value=value, source=source)
    return found


def _setting(
    by_name: Mapping[str, ConfigOption],
    tables: set[str],
    *,
    table: str,
    key: str,
    value: Any,
    source: str,
) -> Any:
    where = f"{source}: {_where(table, key)}"
    option = by_name.get(key)
    if option is None:
        raise ConfigFileError(f"{where} is not a setting{_suggestion(key, by_name, tables)}")
    if option.section.name != table:
        belongs = _table(option.section.name)
        raise ConfigFileError(f"{where}: {key} belongs {belongs}, not {_table(table)}")
    try:
        return _converted(option, value)
    except _WrongValueError as wrong:
        raise ConfigFileError(f"{where} = {_shown(value)}: {wrong}") from None


def _where(table: str, key: str) -> str:
    return f"[{table}] {key}" if table else key


def _table(name: str) -> str:
    return f"in [{name}]" if name else "at the top, before any [section]"


def _suggestion(key: str, by_name: Mapping[str, ConfigOption], tables: set[str]) -> str:
    if key in tables:
        return f": {key} is a section, write it as [{key}]"
    close = difflib.get_close_matches(key.replace("-", "_"), list(by_name), n=1)
    if close:
        option = by_name[close[0]]
        return f"; did you mean {close[0]} ({_table(option.section.name)})?"
    return " of this command (see --help-all)"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _WrongValueError(Exception):
    """What a value should have been."""


def _converted(option: ConfigOption, value: Any) -> Any:
    """A TOML value as the field's type; _WrongValueError saying what was expected."""
    hint = without_none(option.hint)
    optional = hint is not option.hint
    if isinstance(value, dict):
        raise _WrongValueError("a table where a value belongs")
    if optional and hint in (int, float) and isinstance(value, str):
        if value.lower() != NONE:
            raise _WrongValueError(f'expected {_kind(hint)} or "{NONE}"')
        return None
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if value not in choices or not isinstance(value, str):
            raise _WrongValueError(f"expected one of {', '.join(repr(c) for c in choices)}")
        return value
    if typing.get_origin(hint) is tuple:
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        if not isinstance(value, list) or not all(_is(item, v) for v in value):
            raise _WrongValueError(f"expected an array of {_kinds(item)}")
        return tuple(value)
    if hint is float and _is(int, value):
        return float(value)
    if hint is Path or option.path is not None:
        if not isinstance(value, str):
            raise _WrongValueError("expected a path (text)")
        _check_path(option, Path(value))
        return Path(value) if hint is Path else value
    if not _is(hint, value):
        raise _WrongValueError(f"expected {_kind(hint)}")
    return value


def _is(kind: Any, value: Any) -> bool:
    # TOML's booleans are Python's, which are ints too: never a number here.
    if kind in (int, float):
        return isinstance(value, kind) and not isinstance(value, bool)
    return isinstance(value, kind)


def _kinds(kind: Any) -> str:
    return {int: "integers", str: "texts"}.get(kind, repr(kind))


def _kind(kind: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
    return names.get(kind, repr(kind))


def _check_path(option: ConfigOption, path: Path) -> None:
    """The checks the command line makes of the same path."""
    if not option.exists:
        return
    if not path.exists():
        raise _WrongValueError(f"{option.path or 'path'} does not exist")
    if option.path == "file" and path.is_dir():
        raise _WrongValueError("is a directory, not a file")
    if option.path == "dir" and not path.is_dir():
        raise _WrongValueError("is a file, not a directory")


# -- writing -----------------------------------------------------------------------------


def config_to_toml(config: object, *, title: str = "") -> str:
    """`config` (a command's config) as a config file that gives the same config back.

    ValueError for text TOML cannot hold (a lone surrogate from an undecodable file name).
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"{config!r} is not a config")
    lines = [f"# {title}"] if title else []
    for part, options in config_sections(type(config)):
        if lines:
            lines.append("")
        if part != TOP:
            lines += [f"# {part.help}", f"[{part.name}]"]
        for option in options:
            lines += _entry(option, option.value(config))
    return "\n".join(lines) + "\n"


def _entry(option: ConfigOption, value: Any) -> list[str]:
    comment = textwrap.wrap(
        first_sentence(option.help), COMMENT_WIDTH, initial_indent="# ", subsequent_indent="# "
    )
    if value is None:
        if without_none(option.hint) in (int, float):
            return [*comment, f'{option.name} = "{NONE}"']
        return [*comment, f"# {option.name} is not set"]
    return [*comment, f"{option.name} = {_toml_value(value)}"]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Path):
        return _toml_string(str(value))
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped, the rest as is
    (a TOML file is UTF-8, so Макар stays readable)."""
    out = []
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{text!r} holds a lone surrogate, which a TOML file cannot hold")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
