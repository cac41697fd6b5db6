"""Reading OHLCV bars from a CSV file, with errors that name the file, line and problem.

The columns are found by name as fedrl.envs.bar_columns says (a header row is required); a
symbol column makes one file hold many symbols. The delimiter is whichever of , ; tab | the
header uses most. Plain or gzip (found by its magic bytes, not the file name). Ordering,
duplicates and gaps follow fedrl.envs.bars, as for every source; a duplicate timestamp keeps
the file's last row.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fedrl.envs.bar_columns import choose_columns, is_number, parse_time_texts
from fedrl.envs.bars import MarketData, MarketDataError, assemble, encode_symbols

_DELIMITERS = (",", ";", "\t", "|")
_GZIP_MAGIC = b"\x1f\x8b"

FloatArray = npt.NDArray[np.float64]


def load_csv(
    path: str | Path,
    *,
    renames: Mapping[str, str] | None = None,
    indicators: Sequence[str] = (),
    need_symbol: bool = False,
) -> MarketData:
    """Read, validate and order the bars of `path`; raises MarketDataError on any problem.

    `renames` maps roles to this file's column names, `indicators` names extra columns to
    keep as features, `need_symbol` requires a symbol column (symbols were asked for).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise MarketDataError(path, f"cannot read the file: {err.strerror or err}") from err
    text = _decode(path, raw)
    header, rows, lines = _read_rows(path, text)
    choice = choose_columns(
        str(f"{path}:{lines.header}"),
        header,
        renames=renames or {},
        indicators=indicators,
        need_symbol=need_symbol,
        have="the header has",
    )
    index = {name.strip().lower(): i for i, name in reversed(list(enumerate(header)))}

    def column(name: str) -> list[str]:
        at = index[name.strip().lower()]
        return [row[at] for row in rows]

    _check_widths(path, header, rows, lines, [index[n.strip().lower()] for n in choice.all()])

    def locate(row: int) -> str:
        return f"{path}:{lines[row]}"

    return assemble(
        str(path),
        time_ns=parse_time_texts(column(choice.time), locate),
        values={
            role: _parse_numbers(path, role, column(name), lines)
            for role, name in choice.values.items()
        },
        symbols=None
        if choice.symbol is None
        else encode_symbols([s.strip() for s in column(choice.symbol)]),
        indicators={
            name: _parse_numbers(path, name, column(source), lines, missing_ok=True)
            for name, source in choice.indicators.items()
        },
        locate=locate,
        duplicates="keep_last",
    )


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


def _read_rows(path: Path, text: str) -> tuple[list[str], list[list[str]], _LineNumbers]:
    """The header, the data rows, and where each row sits in the file."""
    first_line = text.split("\n", 1)[0]
    delimiter = max(_DELIMITERS, key=first_line.count)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next((row for row in reader if _has_data(row)), None)
        if header is None:
            raise MarketDataError(path, "empty file: expected a header row and bars")
        header_line = reader.line_num
        if is_number(header[0].strip()):
            raise MarketDataError(
                path,
                "the first line holds values, not column names: add a header row such as "
                "timestamp,open,high,low,close,volume",
                line=header_line,
            )
        rows = [row for row in reader if _has_data(row)]
    except csv.Error as err:
        raise MarketDataError(path, f"malformed CSV: {err}", line=reader.line_num) from err
    return header, rows, _LineNumbers(text, delimiter, header_line)


def _check_widths(
    path: Path,
    header: list[str],
    rows: list[list[str]],
    lines: _LineNumbers,
    used: list[int],
) -> None:
    needed = max(used) + 1
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


def _has_data(row: list[str]) -> bool:
    """False for the blank lines (or lines of only spaces) that editors leave behind."""
    return bool(row) and (len(row) > 1 or bool(row[0].strip()))


class _LineNumbers:
    """The file line of each data row, worked out only when an error needs one.

    Tracking lines while reading costs a Python step per row, a third of the read time, and
    a row is not always one line (quoted fields may hold newlines), so they are counted by
    reading the file again the same way.
    """

    def __init__(self, text: str, delimiter: str, header: int) -> None:
        self._text = text
        self._delimiter = delimiter
        self.header = header
        """The header's line."""
        self._lines: list[int] | None = None

    def __getitem__(self, row: int) -> int:
        if self._lines is None:
            reader = csv.reader(io.StringIO(self._text, newline=""), delimiter=self._delimiter)
            rows = (reader.line_num for row in reader if _has_data(row))
            next(rows)  # the header
            self._lines = list(rows)
        return self._lines[row]


def _parse_numbers(
    path: Path, name: str, texts: list[str], lines: _LineNumbers, *, missing_ok: bool = False
) -> FloatArray:
    """A numeric column; with `missing_ok` (indicators) an empty field is NaN, not an error."""
    if missing_ok:
        texts = [text if text.strip() else "nan" for text in texts]
    try:
        # numpy parses the whole column in C; only a failure pays for the row-by-row search.
        values = np.array(texts, dtype=np.float64)
    except ValueError:
        for i, text in enumerate(texts):
            if not is_number(text):
                shown = "an empty value" if not text.strip() else f"non-numeric value {text!r}"
                raise MarketDataError(path, f"{shown} in column {name!r}", line=lines[i]) from None
        raise
    bad = np.flatnonzero(np.isinf(values) if missing_ok else ~np.isfinite(values))
    if bad.size:
        index = int(bad[0])
        raise MarketDataError(
            path, f"non-finite value {texts[index]!r} in column {name!r}", line=lines[index]
        )
    return values
