"""Reading OHLCV bars of many symbols from PostgreSQL, read-only, in one binary COPY.

psycopg 3 speaks libpq, so credentials come the way psql takes them: PGPASSWORD, ~/.pgpass,
a service file (`postgresql:///?service=market`), PGHOST and the rest. A password written into
--data is refused: the command line is readable by anyone on the machine (ps, shell history).

The bars come from a table (`historical_bars` by default) or a query, optionally joined on
symbol and time to an indicators table. One `COPY (SELECT ...) TO STDOUT (FORMAT BINARY)`
streams every chosen symbol, ordered by symbol and time; every column is cast to a fixed
width in the SELECT (a NULL becomes NaN), so each streamed block parses with one
`np.frombuffer` and memory stays at the bars' own size, without a Python object per row
(measured against connectorx and psycopg's row API: docs/benchmarks.md). The session is
read-only: nothing is ever written to the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fedrl.envs.bar_columns import (
    ColumnChoice,
    choose_columns,
    epoch_scale_ns,
    epochs_to_ns,
)
from fedrl.envs.bars import (
    VALUE_COLUMNS,
    MarketData,
    MarketDataError,
    MarketDataUnavailableError,
    assemble,
    format_time,
)

DEFAULT_TABLE = "historical_bars"
URL_PREFIXES = ("postgresql://", "postgres://")
# How long to wait for a server that does not answer before calling it unreachable.
_CONNECT_TIMEOUT_S = 10
# Binary COPY: an 11-byte signature, flags and header-extension length; each row an int16
# field count, then per field an int32 length and the value; an int16 -1 at the end.
_HEADER_BYTES = 19
_TRAILER_BYTES = 2
# Rows gathered before a parse: large enough that numpy's per-call cost vanishes, small
# enough to be a fraction of the bars themselves.
_CHUNK_BYTES = 8 << 20
# PostgreSQL's timestamps count microseconds from 2000-01-01 UTC.
_PG_EPOCH_US = 946_684_800_000_000
_NULL_TIME = np.iinfo(np.int64).min
# Type OIDs (pg_type) of the time column, by how it is read.
_TIMESTAMP_OIDS = {1114, 1184}  # timestamp, timestamptz
_DATE_OIDS = {1082}
_INTEGER_OIDS = {20, 21, 23}  # int8, int2, int4
_FLOAT_OIDS = {700, 701, 1700}  # float4, float8, numeric
_NUMERIC_OIDS = _INTEGER_OIDS | _FLOAT_OIDS

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def is_postgres_url(data: str) -> bool:
    return data.startswith(URL_PREFIXES)


@dataclass(frozen=True)
class BarsQuery:
    """Which rows to read: from where, which columns, symbols and time range."""

    table: str = DEFAULT_TABLE
    query: str | None = None
    """A SELECT whose rows are the bars; replaces `table`."""
    renames: Mapping[str, str] | None = None
    indicators: Sequence[str] = ()
    indicator_table: str | None = None
    symbols: Sequence[str] = ()
    start_ns: int | None = None
    end_ns: int | None = None


def describe_url(url: str) -> str:
    """The server and database of `url` without any password, for logs and reports."""
    parts = _conninfo(url)
    host = parts.get("host") or parts.get("service") or "localhost"
    port = f":{parts['port']}" if parts.get("port") else ""
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname', '')}"


def _conninfo(url: str) -> dict[str, Any]:
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    try:
        return dict(conninfo_to_dict(url))
    except Exception as err:  # psycopg raises ProgrammingError for a malformed string
        raise MarketDataError(
            url.split("?", maxsplit=1)[0], f"not a libpq connection URL: {err}"
        ) from None


def check_no_password(url: str) -> None:
    """Refuse a URL that carries a password: the command line is visible to every user."""
    if _conninfo(url).get("password"):
        raise MarketDataError(
            describe_url(url),
            "the URL holds a password, which anyone on this machine can read in the process "
            "list: put it in PGPASSWORD, ~/.pgpass or a service file (pg_service.conf), "
            "as for psql",
        )


def load_postgres(url: str, query: BarsQuery) -> MarketData:
    """The bars `query` selects; MarketDataUnavailableError when the server cannot be reached or
    has no such bars, MarketDataError (one line, naming the problem) for anything else."""
    import psycopg  # noqa: PLC0415  (only runs that read a database load psycopg)

    check_no_password(url)
    label = describe_url(url)
    what = f"{label} ({_relation_label(query)})"
    try:
        connection = psycopg.connect(url, connect_timeout=_CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as err:
        raise _connect_error(label, err) from None
    try:
        # Every statement runs in a read-only transaction, so the server refuses a write, and
        # the transaction is never committed, so what slips past that (a large object made
        # by a function in --query) is rolled back on close.
        connection.read_only = True
        # Times without a zone mean UTC, as in a CSV; zoned ones are read as UTC.
        connection.execute("SET TIME ZONE 'UTC'")
        return _read(connection, what, query)
    except psycopg.Error as err:
        raise MarketDataError(what, _one_line(err)) from None
    finally:
        connection.close()


def _relation_label(query: BarsQuery) -> str:
    if query.query is not None:
        return "query"
    joined = f" joined with {query.indicator_table}" if query.indicator_table else ""
    return f"table {query.table}{joined}"


def _connect_error(label: str, err: Exception) -> MarketDataError:
    message = _one_line(err)
    # libpq prefixes the server's own words with where it connected, which the label says.
    message = message.rpartition("FATAL:")[2].strip() or message
    sqlstate = getattr(err, "sqlstate", None)
    refused = ("password authentication failed", "no password supplied", "role ")
    if sqlstate in ("28P01", "28000") or any(text in message for text in refused):
        return MarketDataError(
            label,
            f"cannot log in: {message} (libpq reads the password from PGPASSWORD, ~/.pgpass "
            "or a service file)",
        )
    if sqlstate == "3D000" or "does not exist" in message:
        return MarketDataError(label, message)
    return MarketDataUnavailableError(label, f"cannot reach the server: {message}")


def _one_line(err: Exception) -> str:
    diag = getattr(err, "diag", None)
    primary = getattr(diag, "message_primary", None)
    text = primary or str(err)
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _read(connection: Any, what: str, query: BarsQuery) -> MarketData:
    from psycopg import sql  # noqa: PLC0415

    bars_source = (
        sql.SQL("({})").format(sql.SQL(query.query))
        if query.query is not None
        else _identifier(query.table)
    )
    bar_columns = _describe(connection, bars_source)
    from_bars = [] if query.indicator_table else list(query.indicators)
    choice = choose_columns(
        what,
        list(bar_columns),
        renames=query.renames or {},
        indicators=from_bars,
        need_symbol=bool(query.symbols),
    )
    joined = _indicator_columns(connection, what, query, choice)
    symbols = _symbols(connection, what, bars_source, choice, query.symbols)
    time_oid = bar_columns[choice.time]
    statement, params, dtype = _copy_statement(
        source=bars_source,
        query=query,
        choice=choice,
        joined=joined,
        symbols=symbols,
        time_oid=time_oid,
    )
    blocks = _stream(connection, statement, params)
    rows = parse_rows(blocks, dtype, what)
    codes = rows["code"].astype(np.int64) - 1
    names = [*symbols] if symbols else [""]

    def locate(row: int) -> str:
        return f"{what}: {names[codes[row]] or 'bar'} at {_row_time(rows, row, time_oid)}"

    return assemble(
        what,
        time_ns=_times(rows["time"], time_oid, locate),
        values={role: rows[role].astype(np.float64) for role in VALUE_COLUMNS},
        symbols=(codes, names) if symbols else None,
        indicators={name: rows[f"i{i}"].astype(np.float64) for i, name in enumerate(joined)},
        locate=locate,
        duplicates="error",
    )


def _identifier(name: str) -> Any:
    from psycopg import sql  # noqa: PLC0415

    return sql.Identifier(*name.split("."))


def _describe(connection: Any, source: Any) -> dict[str, int]:
    """Column name to type OID, read from an empty result."""
    from psycopg import sql  # noqa: PLC0415

    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("SELECT * FROM {} AS src LIMIT 0").format(source))
        return {column.name: column.type_code for column in cursor.description or ()}


def _indicator_columns(
    connection: Any, what: str, query: BarsQuery, choice: ColumnChoice
) -> dict[str, str]:
    """Indicator name to its column: in the bars, or in the indicators table (all of that
    table's numeric columns other than symbol and time when none are named)."""
    if not query.indicator_table:
        return dict(choice.indicators)
    columns = _describe(connection, _identifier(query.indicator_table))
    where = f"{what}, indicators table {query.indicator_table}"
    keys = choose_keys(where, columns, choice)
    if query.indicators:
        lower = {name.lower(): name for name in columns}
        missing = [name for name in query.indicators if name.lower() not in lower]
        if missing:
            raise MarketDataError(
                where,
                f"missing column(s): {', '.join(missing)}; the table has: {', '.join(columns)}",
            )
        return {name: lower[name.lower()] for name in query.indicators}
    return {
        name: name for name, oid in columns.items() if oid in _NUMERIC_OIDS and name not in keys
    }


def choose_keys(where: str, columns: Mapping[str, int], choice: ColumnChoice) -> set[str]:
    """The indicators table's symbol and time columns, named as in the bars."""
    wanted = [name for name in (choice.symbol, choice.time) if name is not None]
    missing = [name for name in wanted if name not in columns]
    if missing:
        raise MarketDataError(
            where,
            f"missing column(s) to join on: {', '.join(missing)}; the table has: "
            f"{', '.join(columns)}",
        )
    return set(wanted)


def _symbols(
    connection: Any, what: str, source: Any, choice: ColumnChoice, asked: Sequence[str]
) -> list[str]:
    """The symbols to read, sorted: those asked for (each must have bars), or all there are."""
    from psycopg import sql  # noqa: PLC0415

    if choice.symbol is None:
        return []
    column = sql.Identifier(choice.symbol)
    with connection.cursor() as cursor:
        if asked:
            cursor.execute(
                sql.SQL(
                    "SELECT DISTINCT {c}::text FROM {s} AS src WHERE {c}::text = ANY(%s)"
                ).format(c=column, s=source),
                [list(asked)],
            )
            found = {row[0] for row in cursor.fetchall()}
            absent = [symbol for symbol in asked if symbol not in found]
            if absent and found:
                raise MarketDataError(what, f"no bars for symbol(s) {', '.join(absent)}")
            return sorted(set(asked))
        cursor.execute(
            sql.SQL("SELECT DISTINCT {c}::text FROM {s} AS src WHERE {c} IS NOT NULL").format(
                c=column, s=source
            )
        )
        return sorted(row[0] for row in cursor.fetchall())


def _copy_statement(
    *,
    source: Any,
    query: BarsQuery,
    choice: ColumnChoice,
    joined: Mapping[str, str],
    symbols: list[str],
    time_oid: int,
) -> tuple[Any, list[Any], np.dtype[Any]]:
    """The COPY of every chosen row at a fixed width, its parameters and its row dtype."""
    from psycopg import sql  # noqa: PLC0415

    def bar(name: str) -> Any:
        return sql.SQL("b.{}").format(sql.Identifier(name))

    time = bar(choice.time)
    if time_oid in _TIMESTAMP_OIDS or time_oid in _DATE_OIDS:
        time_sql = sql.SQL("COALESCE({}::timestamp, '-infinity')").format(time)
        time_type = ">i8"
    elif time_oid in _INTEGER_OIDS:
        time_sql = sql.SQL("COALESCE({}::int8, -1)").format(time)
        time_type = ">i8"
    elif time_oid in _FLOAT_OIDS:
        time_sql = sql.SQL("COALESCE({}::float8, 'NaN')").format(time)
        time_type = ">f8"
    else:
        # Text and the rest: the server reads it as a time, or says which value it cannot.
        time_sql = sql.SQL("COALESCE({}::timestamptz, '-infinity')").format(time)
        time_type = ">i8"
    code = (
        sql.SQL("array_position(%s::text[], {}::text)").format(bar(choice.symbol))
        if choice.symbol is not None
        else sql.SQL("1")
    )
    numbers = [
        sql.SQL("COALESCE({}::float8, 'NaN')").format(bar(choice.values[role]))
        for role in VALUE_COLUMNS
    ]
    indicator_alias = "i" if query.indicator_table else "b"
    numbers += [
        sql.SQL("COALESCE({}.{}::float8, 'NaN')").format(
            sql.Identifier(indicator_alias), sql.Identifier(column)
        )
        for column in joined.values()
    ]
    params: list[Any] = [symbols] if choice.symbol is not None else []
    join: Any = sql.SQL("")
    if query.indicator_table:
        keys = [name for name in (choice.symbol, choice.time) if name is not None]
        join = sql.SQL(" LEFT JOIN {} AS i ON {}").format(
            _identifier(query.indicator_table),
            sql.SQL(" AND ").join(
                sql.SQL("i.{k} = b.{k}").format(k=sql.Identifier(k)) for k in keys
            ),
        )
    conditions = []
    if choice.symbol is not None:
        conditions.append(sql.SQL("{}::text = ANY(%s)").format(bar(choice.symbol)))
        params.append(symbols)
    if time_oid in _TIMESTAMP_OIDS | _DATE_OIDS:
        # A time range on a time-typed column runs in the server, on its index if it has one.
        if query.start_ns is not None:
            conditions.append(sql.SQL("{} >= to_timestamp(%s)").format(time))
            params.append(query.start_ns / 1e9)
        if query.end_ns is not None:
            conditions.append(sql.SQL("{} < to_timestamp(%s)").format(time))
            params.append(query.end_ns / 1e9)
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    select = sql.SQL(
        "COPY (SELECT {code}::int4, {time}, {numbers} FROM {source} AS b{join}{where} "
        "ORDER BY 1, 2) TO STDOUT (FORMAT BINARY)"
    ).format(
        code=code,
        time=time_sql,
        numbers=sql.SQL(", ").join(numbers),
        source=source,
        join=join,
        where=where,
    )
    return select, params, copy_row_dtype(indicators=len(joined), time_type=time_type)


def copy_row_dtype(*, indicators: int, time_type: str) -> np.dtype[Any]:
    """One binary COPY row of the SELECT above: a field count, then each field's length and
    value (symbol code, time, open..volume, the indicators), big-endian."""
    fields = [("code", ">i4"), ("time", time_type)]
    fields += [(role, ">f8") for role in VALUE_COLUMNS]
    fields += [(f"i{i}", ">f8") for i in range(indicators)]
    layout: list[tuple[str, str]] = [("count", ">i2")]
    for name, kind in fields:
        layout += [(f"{name}_length", ">i4"), (name, kind)]
    return np.dtype(layout)


def _stream(connection: Any, statement: Any, params: list[Any]) -> Iterable[memoryview]:
    with connection.cursor() as cursor, cursor.copy(statement, params) as copy:
        yield from copy


def parse_rows(
    blocks: Iterable[memoryview], dtype: np.dtype[Any], what: str
) -> np.ndarray[Any, Any]:
    """Fixed-width binary COPY rows as one structured array.

    The server sends a message per row; they are gathered into chunks of about
    _CHUNK_BYTES and each chunk parsed at once, so Python touches a row only to append it.
    """
    pending = bytearray()
    parts: list[np.ndarray[Any, Any]] = []
    header_seen = False
    for block in blocks:
        pending += block
        if len(pending) < _CHUNK_BYTES:
            continue
        if not header_seen:
            del pending[:_HEADER_BYTES]
            header_seen = True
        whole = len(pending) // dtype.itemsize * dtype.itemsize
        parts.append(np.frombuffer(bytes(pending[:whole]), dtype=dtype))
        del pending[:whole]
    if not header_seen:
        del pending[:_HEADER_BYTES]
    whole = (len(pending) - _TRAILER_BYTES) // dtype.itemsize * dtype.itemsize
    if len(pending) - whole != _TRAILER_BYTES or whole < 0:
        raise MarketDataError(what, "the server's COPY stream ended mid-row")
    parts.append(np.frombuffer(bytes(pending[:whole]), dtype=dtype))
    rows = np.concatenate(parts)
    widths = [name for name in dtype.names or () if name.endswith("_length")]
    expected = {name: dtype[name.removesuffix("_length")].itemsize for name in widths}
    if any(np.any(rows[name] != size) for name, size in expected.items()):
        raise MarketDataError(what, "unexpected field width in the server's COPY stream")
    return rows


def _times(column: np.ndarray[Any, Any], time_oid: int, locate: Any) -> IntArray:
    if column.dtype.kind == "f":
        numbers = column.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(numbers) | (numbers < 0))
        if bad.size:
            raise MarketDataError(locate(int(bad[0])), "missing time (NULL) or a negative epoch")
        return np.round(numbers * epoch_scale_ns(numbers)).astype(np.int64)
    values = column.astype(np.int64)
    if time_oid in _INTEGER_OIDS:
        return epochs_to_ns(values, locate)
    null = np.flatnonzero(values == _NULL_TIME)
    if null.size:
        raise MarketDataError(locate(int(null[0])), "missing time (NULL)")
    return (values + _PG_EPOCH_US) * 1_000


def _row_time(rows: np.ndarray[Any, Any], row: int, time_oid: int) -> str:
    value = rows["time"][row]
    if time_oid in _INTEGER_OIDS or rows["time"].dtype.kind == "f":
        return f"epoch {value}"
    if int(value) == _NULL_TIME:
        return "a NULL time"
    return format_time((int(value) + _PG_EPOCH_US) * 1_000)
