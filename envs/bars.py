"""OHLCV bars of one or many symbols, and the rules every reader applies to the rows it read.

A reader (CSV, Parquet or Arrow, PostgreSQL) turns its source into columns, one entry per row
in the source's order, and hands them to `assemble`, which checks, orders and splits them by
symbol. So a Parquet file and a CSV of the same rows give the same bars, and every source's
errors name the row where the problem is.

Rules, chosen so that nothing is invented:
- Rows out of time order are sorted by time (some exporters write newest first).
- Duplicate timestamps of one symbol keep the last row of a file (a later row is usually a
  correction); a database table has no such order, so there they are an error.
- Gaps are not filled: bars are consecutive observations, so a position held across a gap
  takes the whole move, as it would in a real account. They are counted in the log.
- Indicator values may be missing (NULL, NaN or empty): the features carry the last known
  value forward (fedrl.envs.features), and how many were missing is logged per column.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

VALUE_COLUMNS = ("open", "high", "low", "close", "volume")
PRICE_COLUMNS = ("open", "high", "low", "close")
# A gap is a spacing above 1.5 typical bars: jitter in exchange timestamps stays below it.
_GAP_FACTOR = 1.5

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Duplicates = Literal["keep_last", "error"]
SymbolColumn = tuple[IntArray, Sequence[str]]
"""Each row's symbol as an index into a sorted list of distinct names."""


class MarketDataError(ValueError):
    """Bars that cannot be used; the message names the source, the row and the problem."""

    def __init__(self, where: Path | str, problem: str, line: int | None = None) -> None:
        place = f"{where}:{line}" if line is not None else str(where)
        super().__init__(f"{place}: {problem}")


class MarketDataUnavailableError(MarketDataError):
    """The source could not be reached or holds no bars: the one case `--fallback` covers."""


@dataclass(frozen=True, eq=False)
class Bars:
    """Time-ordered OHLCV bars of one symbol with unique timestamps; arrays are read-only."""

    time_ns: IntArray
    """Bar time, nanoseconds since the Unix epoch (UTC)."""
    open: FloatArray
    high: FloatArray
    low: FloatArray
    close: FloatArray
    volume: FloatArray
    source: str
    """Where the bars came from, for logs and reports."""
    symbol: str = ""
    """The instrument; empty for a source without a symbol column."""
    indicators: Mapping[str, FloatArray] = field(default_factory=dict)
    """Extra numeric columns used as features, by name; NaN where a value is missing."""

    def __post_init__(self) -> None:
        names = ("time_ns", *VALUE_COLUMNS)
        arrays = [getattr(self, name) for name in names] + list(self.indicators.values())
        lengths = {len(array) for array in arrays}
        if len(lengths) != 1:
            raise ValueError(f"bar columns differ in length: {sorted(lengths)}")
        for array in arrays:
            array.setflags(write=False)

    def __len__(self) -> int:
        return len(self.close)

    @property
    def label(self) -> str:
        """The symbol, or the source when there is none."""
        return self.symbol or self.source


@dataclass(frozen=True, eq=False)
class MarketData:
    """The bars of every symbol of one source, in symbol order, sharing one indicator set."""

    series: tuple[Bars, ...]
    source: str
    synthetic: bool = False
    """Generated bars, not prices: every place a run is shown says so."""

    def __post_init__(self) -> None:
        if not self.series:
            raise ValueError(f"{self.source}: no symbols")
        names = {tuple(bars.indicators) for bars in self.series}
        if len(names) != 1:
            raise ValueError(f"{self.source}: symbols differ in their indicator columns")

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(bars.symbol for bars in self.series)

    @property
    def indicator_names(self) -> tuple[str, ...]:
        return tuple(self.series[0].indicators)

    @property
    def bar_count(self) -> int:
        return sum(len(bars) for bars in self.series)


def assemble(
    source: str,
    *,
    time_ns: IntArray,
    values: Mapping[str, FloatArray],
    symbols: SymbolColumn | None,
    indicators: Mapping[str, FloatArray],
    locate: Callable[[int], str],
    duplicates: Duplicates,
) -> MarketData:
    """Check, order and split rows into bars per symbol; MarketDataError names the bad row.

    `values` holds open..volume, `symbols` each row's symbol as (codes, sorted names) (None:
    one unnamed series; `encode_symbols` makes them from text),
    `indicators` the extra columns (NaN: missing). `locate(i)` says where row i is in the
    source ("bars.csv:12", "... AAPL at 2024-01-02 09:35 UTC"), for the error message.
    """
    if len(time_ns) == 0:
        raise MarketDataUnavailableError(source, "no bars")
    _check_rows(values, locate)
    codes, names = symbols if symbols is not None else (np.zeros(len(time_ns), np.int64), [""])
    order = np.lexsort((time_ns, codes))
    if not np.array_equal(order, np.arange(len(order))):
        logger.info("%s: rows are not in (symbol, time) order; sorted them", source)
    series = []
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    for code, name in enumerate(names):
        rows = order[bounds[code] : bounds[code + 1]]
        series.append(
            _one_series(
                source=source,
                symbol=name,
                time_ns=time_ns,
                values=values,
                indicators=indicators,
                rows=rows,
                locate=locate,
                duplicates=duplicates,
            )
        )
    _report_missing(source, series)
    return MarketData(series=tuple(series), source=source)


def encode_symbols(symbols: Sequence[str]) -> SymbolColumn:
    """Each row's symbol as an index into the sorted distinct symbols."""
    names, codes = np.unique(np.asarray(symbols, dtype=str), return_inverse=True)
    return codes.astype(np.int64), [str(name) for name in names]


def _check_rows(values: Mapping[str, FloatArray], locate: Callable[[int], str]) -> None:
    """Raise for the first impossible row in source order."""
    problems: list[tuple[int, str]] = []

    def first(bad: npt.NDArray[np.bool_], problem: Callable[[int], str]) -> None:
        hits = np.flatnonzero(bad)
        if hits.size:
            problems.append((int(hits[0]), problem(int(hits[0]))))

    for name in VALUE_COLUMNS:
        column = values[name]
        first(~np.isfinite(column), functools.partial(_not_finite, name, column))
    for name in PRICE_COLUMNS:
        column = values[name]
        first(column <= 0, functools.partial(_not_positive, name, column))
    first(
        values["high"] < values["low"],
        lambda i: f"high {values['high'][i]:g} is below low {values['low'][i]:g}",
    )
    first(values["volume"] < 0, lambda i: f"negative volume {values['volume'][i]:g}")
    if problems:
        index, problem = min(problems, key=lambda item: item[0])
        raise MarketDataError(locate(index), problem)


def _not_finite(name: str, column: FloatArray, row: int) -> str:
    if np.isnan(column[row]):
        return f"missing value (NULL or NaN) in column {name!r}"
    return f"non-finite value {column[row]:g} in column {name!r}"


def _not_positive(name: str, column: FloatArray, row: int) -> str:
    return f"non-positive price {column[row]:g} in column {name!r}"


def _one_series(
    *,
    source: str,
    symbol: str,
    time_ns: IntArray,
    values: Mapping[str, FloatArray],
    indicators: Mapping[str, FloatArray],
    rows: IntArray,
    locate: Callable[[int], str],
    duplicates: Duplicates,
) -> Bars:
    times = time_ns[rows]
    same = times[1:] == times[:-1]
    what = f"{symbol}: " if symbol else ""
    if same.any():
        if duplicates == "error":
            row = int(rows[int(np.flatnonzero(same)[0]) + 1])
            raise MarketDataError(
                locate(row),
                f"{int(same.sum())} duplicate timestamps for {symbol or 'the series'}, first "
                f"{format_time(int(times[np.flatnonzero(same)[0]]))}: make (symbol, time) unique, "
                "or select one row per bar with --query",
            )
        logger.warning(
            "%s: %s%d rows repeat an earlier timestamp; kept the last row of each",
            source,
            what,
            int(same.sum()),
        )
    # After a stable sort a later row of the source comes later among equal times: keep it.
    keep = rows[np.append(~same, True)]
    if len(keep) < 2:
        raise MarketDataError(
            source, f"{what}needs at least 2 bars with distinct timestamps, found {len(keep)}"
        )
    spacing = np.diff(time_ns[keep])
    typical = float(np.median(spacing))
    gaps = spacing > _GAP_FACTOR * typical
    if gaps.any():
        logger.info(
            "%s: %s%d gaps longer than %.1f typical bars (largest %.1f bars); not filled in",
            source,
            what,
            int(gaps.sum()),
            _GAP_FACTOR,
            float(spacing.max()) / typical,
        )
    picked = {name: values[name][keep] for name in VALUE_COLUMNS}
    return Bars(
        time_ns=time_ns[keep],
        open=picked["open"],
        high=picked["high"],
        low=picked["low"],
        close=picked["close"],
        volume=picked["volume"],
        source=source,
        symbol=symbol,
        indicators={name: column[keep] for name, column in indicators.items()},
    )


def _report_missing(source: str, series: list[Bars]) -> None:
    for bars in series:
        for name, column in bars.indicators.items():
            missing = int(np.isnan(column).sum())
            if missing:
                logger.warning(
                    "%s: %s%d of %d values missing in indicator %r (%.1f %%); the features "
                    "carry the last known value forward",
                    source,
                    f"{bars.symbol}: " if bars.symbol else "",
                    missing,
                    len(column),
                    name,
                    100 * missing / len(column),
                )


def format_time(time_ns: int) -> str:
    """A bar time as people read it: 2024-01-02 09:35:00 UTC."""
    return str(np.datetime64(time_ns, "ns").astype("datetime64[s]")).replace("T", " ") + " UTC"
