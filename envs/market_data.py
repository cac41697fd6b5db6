"""OHLCV bars, and reading them from a CSV file with errors that name the file, line and problem.

Accepted layout: a header row; a time column named timestamp, open_time, datetime, date or time
(the first of these present wins), holding ISO 8601 text (naive means UTC) or epoch seconds,
milliseconds, microseconds or nanoseconds (told apart by magnitude, which holds for any bars
after March 1973); open, high, low, close and volume columns. Names are matched
case-insensitively and other columns are ignored. The delimiter is whichever of , ; tab | the
header uses most. Plain or gzip (found by its magic bytes, not the file name).

Rules for imperfect files, chosen so nothing is invented:
- Rows out of time order are sorted by time (some exporters write newest first).
- Duplicate timestamps keep the last row in the file: a later row is usually a correction.
- Gaps are not filled: bars are consecutive observations, so a position held across a gap
  takes the whole move, as it would in a real account. They are counted in the log.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import logging
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

TIME_COLUMNS = ("timestamp", "open_time", "datetime", "date", "time")
VALUE_COLUMNS = ("open", "high", "low", "close", "volume")
PRICE_COLUMNS = ("open", "high", "low", "close")
_DELIMITERS = (",", ";", "\t", "|")
_GZIP_MAGIC = b"\x1f\x8b"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Epoch numbers below 1e11 are seconds (until the year 5138), below 1e14 milliseconds, below
# 1e17 microseconds (Binance spot since 2025), else nanoseconds: a bar file never spans these.
_EPOCH_UNITS_NS = ((1e11, 1_000_000_000), (1e14, 1_000_000), (1e17, 1_000), (np.inf, 1))
# A gap is a spacing above 1.5 typical bars: jitter in exchange timestamps stays below it.
_GAP_FACTOR = 1.5

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class MarketDataError(ValueError):
    """A bar file that cannot be used; the message names the file, line and problem."""

    def __init__(self, path: Path | str, problem: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True, eq=False)
class Bars:
    """Time-ordered OHLCV bars with unique timestamps; arrays are read-only and share one length."""

    time_ns: IntArray
    """Bar time, nanoseconds since the Unix epoch (UTC)."""
    open: FloatArray
    high: FloatArray
    low: FloatArray
    close: FloatArray
    volume: FloatArray
    source: str
    """Where the bars came from, for logs and reports."""

    def __post_init__(self) -> None:
        lengths = {len(getattr(self, name)) for name in ("time_ns", *VALUE_COLUMNS)}
        if len(lengths) != 1:
            raise ValueError(f"bar columns differ in length: {sorted(lengths)}")
        for name in ("time_ns", *VALUE_COLUMNS):
            getattr(self, name).setflags(write=False)

    def __len__(self) -> int:
        return len(self.close)


def load_csv(path: str | Path) -> Bars:
    """Read, validate and order the bars of `path`; raises MarketDataError on any problem."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise MarketDataError(path, f"cannot read the file: {err.strerror or err}") from err
    text = _decode(path, raw)
    columns, lines = _read_columns(path, text)
    time_ns = _parse_times(path, columns["time"], lines)
    values = {name: _parse_numbers(path, name, columns[name], lines) for name in VALUE_COLUMNS}
    _check_bars(path, values, lines)
    return _ordered_bars(path, time_ns, values)


def _decode(path: Path, raw: bytes) -> str:
    if raw.startswith(_GZIP_MAGIC):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise MarketDataError(path, f"corrupt or truncated gzip data: {err}") from err
    try:
        # utf-8-sig drops the byte-order mark spreadsheet programs put before the header.
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise MarketDataError(
            path, f"not UTF-8 text (byte {err.start}): expected a CSV file, plain or gzip"
        ) from err


def _read_columns(path: Path, text: str) -> tuple[dict[str, list[str]], _LineNumbers]:
    """The raw strings of the time and OHLCV columns, and where each row sits in the file."""
    first_line = text.split("\n", 1)[0]
    delimiter = max(_DELIMITERS, key=first_line.count)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next((row for row in reader if _has_data(row)), None)
        if header is None:
            raise MarketDataError(path, "empty file: expected a header row and bars")
        indices = _column_indices(path, header, reader.line_num)
        rows = [row for row in reader if _has_data(row)]
    except csv.Error as err:
        raise MarketDataError(path, f"malformed CSV: {err}", line=reader.line_num) from err
    lines = _LineNumbers(text, delimiter)
    needed = max(indices.values()) + 1
    if rows and min(map(len, rows)) < needed:
        index = next(i for i, row in enumerate(rows) if len(row) < needed)
        raise MarketDataError(
            path,
            f"row has {len(rows[index])} fields, but the header puts column "
            f"{header[needed - 1].strip()!r} at field {needed}",
            line=lines[index],
        )
    if len(rows) < 2:
        raise MarketDataError(path, f"needs at least 2 bars, found {len(rows)}")
    columns = {name: [row[index] for row in rows] for name, index in indices.items()}
    return columns, lines


def _has_data(row: list[str]) -> bool:
    """False for the blank lines (or lines of only spaces) that editors leave behind."""
    return bool(row) and (len(row) > 1 or bool(row[0].strip()))


class _LineNumbers:
    """The file line of each data row, worked out only when an error needs one.

    Tracking lines while reading costs a Python step per row, a third of the read time, and
    a row is not always one line (quoted fields may hold newlines), so they are counted by
    reading the file again the same way.
    """

    def __init__(self, text: str, delimiter: str) -> None:
        self._text = text
        self._delimiter = delimiter
        self._lines: list[int] | None = None

    def __getitem__(self, row: int) -> int:
        if self._lines is None:
            reader = csv.reader(io.StringIO(self._text, newline=""), delimiter=self._delimiter)
            rows = (reader.line_num for row in reader if _has_data(row))
            next(rows)  # the header
            self._lines = list(rows)
        return self._lines[row]


def _column_indices(path: Path, header: Sequence[str], line: int) -> dict[str, int]:
    names = [field.strip().lower() for field in header]
    if _is_number(names[0]):
        raise MarketDataError(
            path,
            "the first line holds values, not column names: add a header row such as "
            "timestamp,open,high,low,close,volume",
            line=line,
        )
    indices: dict[str, int] = {}
    time_name = next((name for name in TIME_COLUMNS if name in names), None)
    if time_name is not None:
        indices["time"] = names.index(time_name)
    indices.update({name: names.index(name) for name in VALUE_COLUMNS if name in names})
    missing = [name for name in ("time", *VALUE_COLUMNS) if name not in indices]
    if missing:
        wanted = [
            "a time column (" + "/".join(TIME_COLUMNS) + ")" if m == "time" else m for m in missing
        ]
        raise MarketDataError(
            path,
            f"missing column(s): {', '.join(wanted)}; the header has: {', '.join(header)}",
            line=line,
        )
    return indices


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parse_numbers(path: Path, name: str, texts: list[str], lines: _LineNumbers) -> FloatArray:
    try:
        # numpy parses the whole column in C; only a failure pays for the row-by-row search.
        values = np.array(texts, dtype=np.float64)
    except ValueError:
        for i, text in enumerate(texts):
            if not _is_number(text):
                shown = "an empty value" if not text.strip() else f"non-numeric value {text!r}"
                raise MarketDataError(path, f"{shown} in column {name!r}", line=lines[i]) from None
        raise
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        index = int(bad[0])
        raise MarketDataError(
            path, f"non-finite value {texts[index]!r} in column {name!r}", line=lines[index]
        )
    return values


def _parse_times(path: Path, texts: list[str], lines: _LineNumbers) -> IntArray:
    # The first row decides: a number there means the column holds epochs.
    if _is_number(texts[0]):
        return _parse_epochs(path, texts, lines)
    out = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        try:
            moment = dt.datetime.fromisoformat(text.strip())
        except ValueError:
            raise MarketDataError(path, _bad_time(text), line=lines[i]) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        out[i] = (moment - _EPOCH) // dt.timedelta(microseconds=1) * 1_000
    return out


def _parse_epochs(path: Path, texts: list[str], lines: _LineNumbers) -> IntArray:
    try:
        numbers = np.array(texts, dtype=np.float64)
    except ValueError:
        for i, text in enumerate(texts):
            if not _is_number(text):
                raise MarketDataError(path, _bad_time(text), line=lines[i]) from None
        raise
    bad = np.flatnonzero(~np.isfinite(numbers) | (numbers < 0))
    if bad.size:
        index = int(bad[0])
        raise MarketDataError(path, _bad_time(texts[index]), line=lines[index])
    scale = next(ns for limit, ns in _EPOCH_UNITS_NS if float(np.median(numbers)) < limit)
    try:
        # Integer text parses exactly; float64 would round nanosecond epochs (> 2**53).
        integers = np.array([text.strip() for text in texts], dtype=np.int64)
    except ValueError:
        return np.round(numbers * scale).astype(np.int64)
    return integers * scale


def _bad_time(text: str) -> str:
    return (
        f"cannot read {text!r} as a time: expected ISO 8601 text such as "
        "2024-01-31T12:00:00Z, or an epoch number in seconds or milliseconds"
    )


def _check_bars(path: Path, values: dict[str, FloatArray], lines: _LineNumbers) -> None:
    """Raise for the first impossible bar in file order."""
    problems: list[tuple[int, str]] = []
    for name in PRICE_COLUMNS:
        bad = np.flatnonzero(values[name] <= 0)
        if bad.size:
            index = int(bad[0])
            problems.append(
                (index, f"non-positive price {values[name][index]:g} in column {name!r}")
            )
    bad = np.flatnonzero(values["high"] < values["low"])
    if bad.size:
        index = int(bad[0])
        problems.append(
            (index, f"high {values['high'][index]:g} is below low {values['low'][index]:g}")
        )
    bad = np.flatnonzero(values["volume"] < 0)
    if bad.size:
        index = int(bad[0])
        problems.append((index, f"negative volume {values['volume'][index]:g}"))
    if problems:
        index, problem = min(problems, key=lambda item: item[0])
        raise MarketDataError(path, problem, line=lines[index])


def _ordered_bars(path: Path, time_ns: IntArray, values: dict[str, FloatArray]) -> Bars:
    order = np.argsort(time_ns, kind="stable")
    if not np.array_equal(order, np.arange(len(order))):
        logger.info("%s: rows are not in time order; sorted them by time", path)
    time_ns = time_ns[order]
    # After a stable sort a later row of the file comes later among equal times: keep it.
    keep = np.append(time_ns[1:] != time_ns[:-1], True)
    dropped = int(len(keep) - keep.sum())
    if dropped:
        logger.warning(
            "%s: %d rows repeat an earlier timestamp; kept the last row of each", path, dropped
        )
    time_ns = time_ns[keep]
    if len(time_ns) < 2:
        raise MarketDataError(path, "needs at least 2 bars with distinct timestamps")
    spacing = np.diff(time_ns)
    typical = float(np.median(spacing))
    gaps = spacing > _GAP_FACTOR * typical
    if gaps.any():
        logger.info(
            "%s: %d gaps longer than %.1f typical bars (largest %.1f bars); not filled in",
            path,
            int(gaps.sum()),
            _GAP_FACTOR,
            float(spacing.max()) / typical,
        )
    picked = {name: values[name][order][keep] for name in VALUE_COLUMNS}
    return Bars(
        time_ns=time_ns,
        open=picked["open"],
        high=picked["high"],
        low=picked["low"],
        close=picked["close"],
        volume=picked["volume"],
        source=str(path),
    )
