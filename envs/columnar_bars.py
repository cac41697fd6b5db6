"""Reading OHLCV bars from Parquet and Arrow (IPC/Feather) files, and writing fedrl's own.

pyarrow reads the files (the reference implementation of both formats): only the chosen
columns are read, and their types say how to read them, so a timestamp column needs no
parsing and a text one is read as ISO 8601 like a CSV's. Column names, ordering, duplicates
(the file's last row wins) and errors follow fedrl.envs.bar_columns and fedrl.envs.bars, so a
Parquet file of the same rows as a CSV gives the same bars. An error names the file and the
row (counted from 1, as a spreadsheet shows it).

`write_market` stores a MarketData as Parquet with its source and indicator names in the
file's metadata: the market cache a training run reads its database bars from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fedrl.envs.bar_columns import (
    bad_time,
    choose_columns,
    epoch_scale_ns,
    epochs_to_ns,
    parse_time_texts,
)
from fedrl.envs.bars import (
    VALUE_COLUMNS,
    MarketData,
    MarketDataError,
    SymbolColumn,
    assemble,
    encode_symbols,
)

PARQUET_MAGIC = b"PAR1"
ARROW_FILE_MAGIC = b"ARROW1"
# An Arrow IPC stream starts with a continuation marker; a Feather v2 file is an IPC file.
ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"
_SOURCE_KEY = b"fedrl.source"
_INDICATORS_KEY = b"fedrl.indicators"
_SYNTHETIC_KEY = b"fedrl.synthetic"

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def is_columnar(head: bytes) -> bool:
    """Whether a file starting with `head` is Parquet or Arrow."""
    return head.startswith((PARQUET_MAGIC, ARROW_FILE_MAGIC, ARROW_STREAM_MAGIC))


def load_columnar(
    path: str | Path,
    *,
    renames: Mapping[str, str] | None = None,
    indicators: Sequence[str] = (),
    need_symbol: bool = False,
) -> MarketData:
    """The bars of a Parquet or Arrow file; MarketDataError names the file, row and problem.

    A file written by `write_market` names its own source and indicators, and whether its
    bars are synthetic.
    """
    import pyarrow as pa  # noqa: PLC0415  (only runs that read these files load pyarrow)

    path = Path(path)
    schema = _read(path, lambda pq, ipc: pq.read_schema(path), lambda reader: reader.schema)
    metadata = schema.metadata or {}
    if not indicators and _INDICATORS_KEY in metadata:
        indicators = json.loads(metadata[_INDICATORS_KEY])
    source = metadata.get(_SOURCE_KEY, str(path).encode()).decode()
    choice = choose_columns(
        str(path),
        schema.names,
        renames=renames or {},
        indicators=indicators,
        need_symbol=need_symbol,
    )
    # Only the chosen columns are read: a wide file costs what its bars cost.
    table = _read(
        path,
        lambda pq, ipc: pq.read_table(path, columns=choice.all()),
        lambda reader: reader.read_all().select(choice.all()),
    )

    def locate(row: int) -> str:
        return f"{path} row {row + 1}"

    if table.num_rows < 2:
        raise MarketDataError(path, f"needs at least 2 bars, found {table.num_rows}")
    market = assemble(
        source,
        time_ns=_times(table.column(choice.time), locate),
        values={
            role: _numbers(path, role, table.column(name), pa)
            for role, name in choice.values.items()
        },
        symbols=None if choice.symbol is None else _symbols(table.column(choice.symbol), locate),
        indicators={
            name: _numbers(path, name, table.column(column), pa)
            for name, column in choice.indicators.items()
        },
        locate=locate,
        duplicates="keep_last",
    )
    synthetic = metadata.get(_SYNTHETIC_KEY) == b"true"
    return MarketData(series=market.series, source=market.source, synthetic=synthetic)


def market_label(path: Path) -> tuple[str, bool]:
    """(source, synthetic) that a file written by `write_market` states; the path and False
    for any other file."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # not Parquet (a CSV, an Arrow file): it states nothing
        return str(path), False
    source = metadata.get(_SOURCE_KEY, str(path).encode()).decode()
    return source, metadata.get(_SYNTHETIC_KEY) == b"true"


def _read(path: Path, parquet: Callable[[Any, Any], Any], arrow: Callable[[Any], Any]) -> Any:
    """`parquet(pq, ipc)` for a Parquet file, `arrow(reader)` for an Arrow file or stream."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415
    from pyarrow import ipc  # noqa: PLC0415

    try:
        with path.open("rb") as file:
            head = file.read(8)
        if head.startswith(PARQUET_MAGIC):
            return parquet(pq, ipc)
        # Memory-mapped: an IPC file's columns are used where they lie, never copied whole
        # (the map stays open as long as the arrays read from it live).
        opened = ipc.open_file if head.startswith(ARROW_FILE_MAGIC) else ipc.open_stream
        return arrow(opened(pa.memory_map(str(path))))
    except OSError as err:
        raise MarketDataError(path, f"cannot read the file: {err.strerror or err}") from err
    except pa.ArrowException as err:
        raise MarketDataError(path, f"not a readable Parquet or Arrow file: {err}") from err


def _times(column: Any, locate: Any) -> IntArray:
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    kind = column.type
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise MarketDataError(locate(row), "missing time (NULL)")
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        # Naive timestamps mean UTC, as in a CSV; aware ones are stored as UTC already.
        as_ns = pc.cast(column, pa.timestamp("ns", tz=getattr(kind, "tz", None)))
        return np.asarray(as_ns.cast(pa.int64()).to_numpy(), dtype=np.int64)
    if pa.types.is_integer(kind):
        return epochs_to_ns(np.asarray(column.to_numpy(), dtype=np.int64), locate)
    if pa.types.is_floating(kind):
        numbers = np.asarray(column.to_numpy(), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(numbers) | (numbers < 0))
        if bad.size:
            raise MarketDataError(locate(int(bad[0])), bad_time(str(numbers[int(bad[0])])))
        return np.round(numbers * epoch_scale_ns(numbers)).astype(np.int64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return parse_time_texts(column.to_pylist(), locate)
    raise MarketDataError(locate(0), f"cannot read a time from a column of type {kind}")


def _numbers(path: Path, name: str, column: Any, pa: Any) -> FloatArray:
    """A numeric column as float64, NULL as NaN (an error for prices, missing for indicators)."""
    try:
        cast = column.cast(pa.float64())
    except pa.ArrowException as err:
        raise MarketDataError(path, f"column {name!r} is not numeric ({column.type})") from err
    return np.asarray(cast.to_numpy(zero_copy_only=False), dtype=np.float64)


def _symbols(column: Any, locate: Any) -> SymbolColumn:
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise MarketDataError(locate(row), "missing symbol (NULL)")
    return encode_symbols([str(symbol) for symbol in column.to_pylist()])


def write_market(market: MarketData, path: Path) -> None:
    """`market` as one Parquet file (written whole, then renamed into place)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    series = market.series
    columns: dict[str, Any] = {
        "symbol": pa.array(np.repeat([b.symbol for b in series], [len(b) for b in series])),
        "timestamp": pa.array(
            np.concatenate([b.time_ns for b in series]), type=pa.timestamp("ns", tz="UTC")
        ),
    }
    for name in VALUE_COLUMNS:
        columns[name] = pa.array(np.concatenate([getattr(b, name) for b in series]))
    for name in market.indicator_names:
        columns[name] = pa.array(np.concatenate([b.indicators[name] for b in series]))
    table = pa.table(columns).replace_schema_metadata(
        {
            _SOURCE_KEY: market.source.encode(),
            _INDICATORS_KEY: json.dumps(list(market.indicator_names)).encode(),
            _SYNTHETIC_KEY: b"true" if market.synthetic else b"false",
        }
    )
    # A name of this process's own: learner ranks may write the same market at once.
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    pq.write_table(table, partial)
    partial.replace(path)
