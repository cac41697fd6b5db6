"""Help by section: a command with many settings shows the common ones, the rest on request.

`--help` of a command whose config names common settings lists those under their sections'
headings, then every section with its size and the option that shows it; `--help-section
NAME` shows one section in full, `--help-all` every section in full. A command without
common settings shows everything, under its sections' headings where it has several. The
sections are the config's own (fedrl.common.config_fields), so the help, the config file's
tables and `fedrl-client config`'s output share one layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from fedrl.common.config_fields import TOP, Section, first_sentence

F = TypeVar("F", bound=Callable[..., Any])

_MODE = "fedrl.help"
"""ctx.meta key: what the help shows, BRIEF, ALL or a section's name."""
BRIEF = ""
ALL = "*"


class FieldOption(click.Option):
    """The option of one config field: it knows its section and whether it is common."""

    def __init__(self, *args: Any, section: Section, common: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.section = section
        self.common = common

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None or _mode(ctx) != BRIEF or not self.help:
            return record
        # The gist in the short help, and the default and range click appends after it.
        term, text = record
        if text.startswith(self.help):
            text = first_sentence(self.help) + text[len(self.help) :]
        return term, text


class SectionedHelp(click.Command):
    """The options part of a command's help, by section (see the module docstring)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        params = self.get_params(ctx)
        fields = [p for p in params if isinstance(p, FieldOption)]
        others = [p for p in params if not isinstance(p, FieldOption)]
        sections = _by_section(fields)
        mode = _mode(ctx)
        if mode not in (BRIEF, ALL):
            for part, members in sections:
                if part.name == mode:
                    _write_section(ctx, formatter, part, members)
            return
        brief = mode == BRIEF and any(p.common for p in fields)
        for part, members in sections:
            shown = [p for p in members if p.common] if brief else members
            if shown:
                _write_section(ctx, formatter, part, shown, several=len(sections) > 1)
        if brief:
            with formatter.section("Sections (one in full: --help-section NAME; all: --help-all)"):
                formatter.write_dl(
                    [(part.name, first_sentence(part.help)) for part, _ in sections if part != TOP]
                )
        _write_rows(ctx, formatter, "Other options" if fields else "Options", others)
        if isinstance(self, click.Group):
            self.format_commands(ctx, formatter)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if _mode(ctx) in (BRIEF, ALL):
            super().format_help(ctx, formatter)
            return
        # One section: the usage and that section, without the command's story.
        self.format_usage(ctx, formatter)
        self.format_options(ctx, formatter)


class ConfigCommand(SectionedHelp):
    """A command whose help shows its config's settings by section."""


class ConfigGroup(SectionedHelp, click.Group):
    """A group whose help shows its config's settings by section; its commands too."""

    command_class = ConfigCommand


def help_options(section_names: Sequence[str]) -> list[Callable[[F], F]]:
    """The decorators of --help-all, and of --help-section NAME when there are sections."""
    options = [
        click.option(
            "--help-all",
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_show(ALL),
            help="Show every option, by section, and exit.",
        )
    ]
    if section_names:
        options.append(
            click.option(
                "--help-section",
                type=click.Choice(section_names),
                expose_value=False,
                is_eager=True,
                callback=_show(None),
                metavar="NAME",
                help="Show every option of one section and exit.",
            )
        )
    return options


def _show(mode: str | None) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if not value or ctx.resilient_parsing:
            return
        ctx.meta[_MODE] = mode if mode is not None else value
        click.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()

    return callback


def _mode(ctx: click.Context) -> str:
    mode: str = ctx.meta.get(_MODE, BRIEF)
    return mode


def _by_section(fields: Sequence[FieldOption]) -> list[tuple[Section, list[FieldOption]]]:
    grouped: dict[Section, list[FieldOption]] = {}
    for option in fields:
        grouped.setdefault(option.section, []).append(option)
    return list(grouped.items())


def _write_section(
    ctx: click.Context,
    formatter: click.HelpFormatter,
    part: Section,
    members: Sequence[FieldOption],
    *,
    several: bool = True,
) -> None:
    title = "Options" if part == TOP or not several else f"{part.name} — {part.help.rstrip('.')}"
    _write_rows(ctx, formatter, title, members)


def _write_rows(
    ctx: click.Context,
    formatter: click.HelpFormatter,
    title: str,
    params: Sequence[click.Parameter],
) -> None:
    rows = [record for p in params if (record := p.get_help_record(ctx)) is not None]
    if rows:
        with formatter.section(title):
            formatter.write_dl(rows)
