"""Where the bars come from and which of them to trade: the source options and the loader.

`--data` names the source: a CSV (plain or gzip), a Parquet or Arrow file (told by their
magic bytes), or a PostgreSQL URL (postgresql://...). The options pick the table or query,
the columns, the symbols, the time range, the bar size and the indicator columns, the same
way for every source. Without --data the market is synthetic; with --data, synthetic bars
come only from `--fallback synthetic` when the source is unreachable or empty. Synthetic
bars say so in their MarketData, and every place a run is shown repeats it.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from fedrl.common.config_cli import doc
from fedrl.envs.bar_columns import parse_renames
from fedrl.envs.bars import (
    VALUE_COLUMNS,
    Bars,
    MarketData,
    MarketDataError,
    MarketDataUnavailableError,
)
from fedrl.envs.columnar_bars import is_columnar, load_columnar
from fedrl.envs.csv_bars import load_csv
from fedrl.envs.postgres_bars import DEFAULT_TABLE, BarsQuery, is_postgres_url, load_postgres
from fedrl.envs.synthetic import synthetic_bars

logger = logging.getLogger(__name__)

Fallback = Literal["none", "synthetic"]
_UNITS_NS = {
    "s": 1_000_000_000,
    "min": 60_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
    "w": 604_800_000_000_000,
}
_TIMEFRAME = re.compile(r"^\s*(\d+)\s*(s|min|m|h|d|w)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class MarketSource:
    """Which bars of --data to trade; the defaults take every bar of every symbol as stored."""

    table: str = field(
        default=DEFAULT_TABLE,
        metadata=doc("PostgreSQL --data: the table of bars (schema.table allowed)."),
    )
    query: str | None = field(
        default=None,
        metadata=doc("PostgreSQL --data: a SELECT whose rows are the bars, instead of --table."),
    )
    columns: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "Column names that differ from the defaults, as ROLE=NAME, once per column "
            "(roles: symbol, time, open, high, low, close, volume), e.g. --columns time=ts."
        ),
    )
    symbols: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "Symbols to trade, repeated or comma-separated (--symbols AAPL,MSFT); default: "
            "every symbol of the source."
        ),
    )
    timeframe: str | None = field(
        default=None,
        metadata=doc(
            "Bar size to trade, aggregated from finer bars (15min, 1h, 1d); default: as stored."
        ),
    )
    start: str | None = field(
        default=None,
        metadata=doc("First bar time to use, ISO 8601 (UTC when it names no zone), inclusive."),
    )
    end: str | None = field(
        default=None,
        metadata=doc("Use bars before this time, ISO 8601 (UTC when it names no zone)."),
    )
    indicators: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "Extra numeric columns to use as features, normalised causally (repeated or "
            "comma-separated); with --indicator-table and none named, all of that table's."
        ),
    )
    indicator_table: str | None = field(
        default=None,
        metadata=doc(
            "PostgreSQL --data: a table of indicators joined to the bars on symbol and time "
            "(e.g. technical_indicators)."
        ),
    )
    fallback: Fallback = field(
        default="none",
        metadata=doc(
            'When --data is unreachable or empty: "none" stops with the error; "synthetic" '
            "trains on the synthetic market instead, marked as synthetic wherever the run shows."
        ),
    )

    def __post_init__(self) -> None:
        # Repeated and comma-separated forms mean the same list.
        for name in ("symbols", "indicators"):
            values = tuple(
                part.strip() for value in getattr(self, name) for part in value.split(",")
            )
            object.__setattr__(self, name, tuple(dict.fromkeys(v for v in values if v)))
        parse_renames(self.columns)
        if self.timeframe is not None:
            timeframe_ns(self.timeframe)
        start, end = parse_time_option(self.start, "start"), parse_time_option(self.end, "end")
        if start is not None and end is not None and start >= end:
            raise ValueError(f"start {self.start} must come before end {self.end}")
        if self.fallback not in ("none", "synthetic"):
            raise ValueError(f"fallback must be none or synthetic, got {self.fallback!r}")
        if self.query is not None and self.table != DEFAULT_TABLE:
            raise ValueError("give --table or --query, not both")


def timeframe_ns(text: str) -> int:
    """`15min`, `1h`, `1d` as nanoseconds; ValueError says what is accepted."""
    match = _TIMEFRAME.match(text)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(
            f"timeframe {text!r}: expected a count and a unit, such as 30s, 5min, 1h, 1d or 1w"
        )
    return int(match.group(1)) * _UNITS_NS[match.group(2).lower()]


def parse_time_option(text: str | None, name: str) -> int | None:
    """An ISO 8601 option as nanoseconds since the epoch (UTC when naive)."""
    if text is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{name} {text!r}: expected an ISO 8601 time such as 2024-01-31 or 2024-01-31T09:30:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1) * 1000


def load_market_data(
    data: str | None, source: MarketSource, *, seed: int, synthetic_count: int
) -> MarketData:
    """The bars a run trades: `data` read and selected by `source`, or the synthetic market
    (without `data`, or with it unreachable or empty and `source.fallback` "synthetic")."""
    if data is None:
        market = synthetic_market(seed, synthetic_count, reason="no --data given")
        logger.warning("trading on SYNTHETIC data (%s), not real prices", market.source)
        return market
    try:
        return select(read_source(data, source), source)
    except MarketDataUnavailableError as err:
        if source.fallback != "synthetic":
            raise MarketDataUnavailableError(
                str(err), "give --fallback synthetic to train on a synthetic market instead"
            ) from None
        market = synthetic_market(seed, synthetic_count, reason=f"fallback: {err}")
        logger.warning("trading on SYNTHETIC data (%s), not real prices", market.source)
        return market


def synthetic_market(seed: int, count: int, *, reason: str) -> MarketData:
    bars = synthetic_bars(count, seed)
    return MarketData(series=(bars,), source=f"SYNTHETIC {bars.source} ({reason})", synthetic=True)


def read_source(data: str, source: MarketSource) -> MarketData:
    """Every bar `data` holds for the chosen symbols and columns (PostgreSQL: in the range)."""
    renames = parse_renames(source.columns)
    if is_postgres_url(data):
        return load_postgres(
            data,
            BarsQuery(
                table=source.table,
                query=source.query,
                renames=renames,
                indicators=source.indicators,
                indicator_table=source.indicator_table,
                symbols=source.symbols,
                start_ns=parse_time_option(source.start, "start"),
                end_ns=parse_time_option(source.end, "end"),
            ),
        )
    database_only = [
        name
        for name, given in (
            ("--query", source.query is not None),
            ("--indicator-table", source.indicator_table is not None),
            ("--table", source.table != DEFAULT_TABLE),
        )
        if given
    ]
    if database_only:
        raise ValueError(
            f"{', '.join(database_only)} read a PostgreSQL table; --data {data} is a file"
        )
    path = Path(data)
    try:
        with path.open("rb") as file:
            head = file.read(8)
    except OSError as err:
        raise MarketDataError(path, f"cannot read the file: {err.strerror or err}") from err
    load = load_columnar if is_columnar(head) else load_csv
    return load(
        path,
        renames=renames,
        indicators=source.indicators,
        need_symbol=bool(source.symbols),
    )


def select(market: MarketData, source: MarketSource) -> MarketData:
    """The chosen symbols, time range and bar size of `market`."""
    series = list(market.series)
    if source.symbols:
        have = {bars.symbol: bars for bars in series}
        absent = [symbol for symbol in source.symbols if symbol not in have]
        if absent:
            raise MarketDataError(
                market.source,
                f"no bars for symbol(s) {', '.join(absent)}; it has {', '.join(sorted(have))}",
            )
        series = [have[symbol] for symbol in sorted(source.symbols)]
    start = parse_time_option(source.start, "start")
    end = parse_time_option(source.end, "end")
    if start is not None or end is not None:
        series = [_in_range(bars, start, end) for bars in series]
        if not any(len(bars) for bars in series):
            raise MarketDataUnavailableError(
                market.source,
                f"no bars between {source.start or 'the start'} and {source.end or 'the end'}",
            )
        short = [bars.label for bars in series if len(bars) < 2]
        if short:
            raise MarketDataError(
                market.source,
                f"fewer than 2 bars between {source.start or 'the start'} and "
                f"{source.end or 'the end'} for {', '.join(short)}",
            )
    if source.timeframe is not None:
        step = timeframe_ns(source.timeframe)
        series = [resample(bars, step, source.timeframe) for bars in series]
    return MarketData(series=tuple(series), source=market.source, synthetic=market.synthetic)


def _in_range(bars: Bars, start: int | None, end: int | None) -> Bars:
    keep = np.ones(len(bars), dtype=np.bool_)
    if start is not None:
        keep &= bars.time_ns >= start
    if end is not None:
        keep &= bars.time_ns < end
    return _pick(bars, keep, bars.time_ns[keep])


def resample(bars: Bars, step_ns: int, name: str) -> Bars:
    """Bars of `step_ns` each (aligned to the epoch: days start at 00:00 UTC), from finer bars:
    first open, highest high, lowest low, last close, summed volume, last indicator value."""
    spacing = int(np.median(np.diff(bars.time_ns)))
    if step_ns < spacing:
        raise MarketDataError(
            bars.source,
            f"{bars.label}: bars are {format_span(spacing)} apart; --timeframe {name} cannot "
            "make them finer",
        )
    buckets = bars.time_ns // step_ns
    starts = np.flatnonzero(np.diff(buckets, prepend=buckets[0] - 1))
    ends = np.append(starts[1:], len(bars)) - 1
    indicators = {n: column[ends] for n, column in bars.indicators.items()}
    return Bars(
        time_ns=buckets[starts] * step_ns,
        open=bars.open[starts],
        high=np.maximum.reduceat(bars.high, starts),
        low=np.minimum.reduceat(bars.low, starts),
        close=bars.close[ends],
        volume=np.add.reduceat(bars.volume, starts),
        source=bars.source,
        symbol=bars.symbol,
        indicators=indicators,
    )


def _pick(bars: Bars, keep: np.ndarray, time_ns: np.ndarray) -> Bars:
    values = {name: getattr(bars, name)[keep] for name in VALUE_COLUMNS}
    return Bars(
        time_ns=time_ns,
        source=bars.source,
        symbol=bars.symbol,
        indicators={name: column[keep] for name, column in bars.indicators.items()},
        **values,
    )


def format_span(ns: int) -> str:
    """A bar spacing as people say it: 5min, 1h, 1d."""
    for unit, size in (("d", _UNITS_NS["d"]), ("h", _UNITS_NS["h"]), ("min", _UNITS_NS["m"])):
        if ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns / 1e9:g}s"
