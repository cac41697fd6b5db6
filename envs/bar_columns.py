"""Which column of a source holds what: the names every reader looks for, and bar times.

Roles: a symbol column (optional: without one the source is one series), a time column (the
first present of timestamp, open_time, datetime, date, time), open, high, low, close, volume,
and the indicator columns asked for. `columns` renames a role (`close=adj_close`). Names match
case-insensitively, as people write them in spreadsheets and SQL alike.

Times are ISO 8601 text (naive means UTC) or epoch seconds, milliseconds, microseconds or
nanoseconds, told apart by magnitude (which holds for any bars after March 1973).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedrl.envs.bars import VALUE_COLUMNS, MarketDataError

TIME_COLUMNS = ("timestamp", "open_time", "datetime", "date", "time")
SYMBOL_COLUMN = "symbol"
ROLES = ("symbol", "time", *VALUE_COLUMNS)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Epoch numbers below 1e11 are seconds (until the year 5138), below 1e14 milliseconds, below
# 1e17 microseconds (Binance spot since 2025), else nanoseconds: a bar file never spans these.
_EPOCH_UNITS_NS = ((1e11, 1_000_000_000), (1e14, 1_000_000), (1e17, 1_000), (np.inf, 1))

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ColumnChoice:
    """The source's own column name for each role; symbol is None for a one-series source."""

    symbol: str | None
    time: str
    values: Mapping[str, str]
    """open..volume to the source's names."""
    indicators: Mapping[str, str]
    """Indicator name (as asked) to the source's name."""

    def all(self) -> list[str]:
        """Every chosen column, symbol and time first."""
        named = [] if self.symbol is None else [self.symbol]
        return [*named, self.time, *self.values.values(), *self.indicators.values()]


def parse_renames(columns: Sequence[str]) -> dict[str, str]:
    """`("close=adj_close", ...)` as {role: name}; ValueError names a bad entry."""
    renames: dict[str, str] = {}
    for entry in columns:
        role, sep, name = entry.partition("=")
        role, name = role.strip().lower(), name.strip()
        if not sep or not name or role not in ROLES:
            raise ValueError(
                f"column {entry!r}: expected ROLE=NAME with ROLE one of {', '.join(ROLES)}"
            )
        renames[role] = name
    return renames


def choose_columns(
    where: str,
    available: Sequence[str],
    *,
    renames: Mapping[str, str],
    indicators: Sequence[str],
    need_symbol: bool,
    have: str = "the source has",
) -> ColumnChoice:
    """Match roles to `available` names; MarketDataError lists what is missing and what exists."""
    by_lower = {name.strip().lower(): name for name in available}

    def find(name: str) -> str | None:
        return by_lower.get(name.strip().lower())

    missing: list[str] = []
    time = (
        find(renames["time"])
        if "time" in renames
        else next((by_lower[n] for n in TIME_COLUMNS if n in by_lower), None)
    )
    if time is None:
        missing.append(
            renames["time"]
            if "time" in renames
            else "a time column (" + "/".join(TIME_COLUMNS) + ")"
        )
    values: dict[str, str] = {}
    for role in VALUE_COLUMNS:
        found = find(renames.get(role, role))
        if found is None:
            missing.append(renames.get(role, role))
        else:
            values[role] = found
    symbol = find(renames.get("symbol", SYMBOL_COLUMN))
    if symbol is None and (need_symbol or "symbol" in renames):
        missing.append(f"{renames.get('symbol', SYMBOL_COLUMN)} (to pick symbols)")
    chosen: dict[str, str] = {}
    for name in indicators:
        found = find(name)
        if found is None:
            missing.append(f"{name} (an indicator)")
        else:
            chosen[name] = found
    if missing:
        raise MarketDataError(
            where,
            f"missing column(s): {', '.join(missing)}; {have}: "
            f"{', '.join(str(a) for a in available)}",
        )
    assert time is not None
    return ColumnChoice(symbol=symbol, time=time, values=values, indicators=chosen)


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def epoch_scale_ns(numbers: npt.NDArray[np.float64]) -> int:
    """Nanoseconds per unit of these epoch numbers, from their magnitude."""
    return next(ns for limit, ns in _EPOCH_UNITS_NS if float(np.median(numbers)) < limit)


def parse_time_texts(texts: Sequence[str], locate: Callable[[int], str]) -> IntArray:
    """Times given as text, ISO 8601 or epoch numbers; the first row decides which."""
    if is_number(texts[0]):
        return _parse_epochs(texts, locate)
    out = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        try:
            moment = dt.datetime.fromisoformat(text.strip())
        except ValueError:
            raise MarketDataError(locate(i), bad_time(text)) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        out[i] = (moment - _EPOCH) // dt.timedelta(microseconds=1) * 1_000
    return out


def _parse_epochs(texts: Sequence[str], locate: Callable[[int], str]) -> IntArray:
    try:
        numbers = np.array(texts, dtype=np.float64)
    except ValueError:
        for i, text in enumerate(texts):
            if not is_number(text):
                raise MarketDataError(locate(i), bad_time(text)) from None
        raise
    bad = np.flatnonzero(~np.isfinite(numbers) | (numbers < 0))
    if bad.size:
        index = int(bad[0])
        raise MarketDataError(locate(index), bad_time(texts[index]))
    scale = epoch_scale_ns(numbers)
    try:
        # Integer text parses exactly; float64 would round nanosecond epochs (> 2**53).
        integers = np.array([text.strip() for text in texts], dtype=np.int64)
    except ValueError:
        return np.round(numbers * scale).astype(np.int64)
    return integers * scale


def epochs_to_ns(numbers: npt.NDArray[np.int64], locate: Callable[[int], str]) -> IntArray:
    """Integer epoch numbers of any unit as nanoseconds; a negative one is refused."""
    bad = np.flatnonzero(numbers < 0)
    if bad.size:
        index = int(bad[0])
        raise MarketDataError(locate(index), bad_time(str(numbers[index])))
    return numbers * epoch_scale_ns(numbers.astype(np.float64))


def bad_time(text: str) -> str:
    return (
        f"cannot read {text!r} as a time: expected ISO 8601 text such as "
        "2024-01-31T12:00:00Z, or an epoch number in seconds or milliseconds"
    )
