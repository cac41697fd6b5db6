"""Seconds from bars at rest to a ready fedrl/Trading-v0: PostgreSQL beside CSV and Parquet.

The same bars (4 symbols of hourly synthetic bars, 1,000,000 in all; --quick: 100,000) are
written to a PostgreSQL table, a CSV with a symbol column and a Parquet file, and each is read
into a TradingEnv the way a run reads it: parsed, checked, split by symbol and featurised
(the env's in-process cache is cleared before each read). PostgreSQL runs on this machine
(a throwaway server, as the tests start one: tests/support/postgres.py), read over TCP.
Also measured: the peak resident memory each read adds (a fresh child process per read;
the bars and features themselves are 80 bytes a bar).

    .venv/bin/python bench/market_data.py [--quick] [--repeats 3] [--drivers]

`--drivers` also times the PostgreSQL read alone, rows to numpy or Arrow, three ways:
fedrl's reader (psycopg's binary COPY parsed by numpy), psycopg's row API (fetchall), and
connectorx to Arrow when it is installed (`pip install connectorx`: not a dependency;
it needs the password in the URL).

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

# The throwaway server comes from the tests' harness, in this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedrl.envs import trading
from fedrl.envs.synthetic import synthetic_bars
from tests.support.postgres import running_postgres, unavailable_reason

SYMBOLS = ("AAPL", "MSFT", "NVDA", "TSLA")


def make_bars(total: int) -> dict[str, Any]:
    """Columns of `total` bars over SYMBOLS, symbol by symbol."""
    per = total // len(SYMBOLS)
    parts = [synthetic_bars(per, seed) for seed in range(len(SYMBOLS))]
    return {
        "symbol": np.repeat(np.array(SYMBOLS), per),
        "time_ns": np.concatenate([b.time_ns for b in parts]),
        **{
            name: np.concatenate([getattr(b, name) for b in parts])
            for name in ("open", "high", "low", "close", "volume")
        },
    }


def write_text(columns: dict[str, Any], path: Path, *, postgres: bool) -> None:
    """A CSV (header, epoch ms) or PostgreSQL's COPY text (no header, ISO times)."""
    times = (
        np.datetime_as_string(columns["time_ns"].astype("datetime64[ns]"), unit="us").astype(object)
        + "+00"
        if postgres
        else (columns["time_ns"] // 1_000_000).astype(str)
    )
    sep = "\t" if postgres else ","
    values = [columns[n].tolist() for n in ("open", "high", "low", "close", "volume")]
    with path.open("w") as out:
        if not postgres:
            out.write("symbol,timestamp,open,high,low,close,volume\n")
        for row in zip(columns["symbol"].tolist(), times.tolist(), *values, strict=True):
            out.write(sep.join(map(str, row[:2])) + sep + sep.join(map(repr, row[2:])) + "\n")


def load_postgres(url_conninfo: str, text: Path) -> None:
    import psycopg  # noqa: PLC0415

    with psycopg.connect(url_conninfo) as connection:
        connection.execute(
            "CREATE TABLE historical_bars (symbol text, timestamp timestamptz, open float8, "
            "high float8, low float8, close float8, volume float8, PRIMARY KEY (symbol, timestamp))"
        )
        with connection.cursor().copy("COPY historical_bars FROM STDIN") as copy, text.open() as f:
            while block := f.read(1 << 20):
                copy.write(block)


def high_water_mb() -> float:
    """This process's peak resident memory (VmHWM: per process image, so a spawned child
    does not inherit its parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def timed_read(data: str, queue: Any) -> None:
    """In a child: read `data` into an env; report seconds, bars and the peak memory added."""
    import psycopg  # noqa: F401, PLC0415  (loaded before the baseline, like pyarrow)
    import pyarrow.parquet  # noqa: F401, PLC0415

    before = high_water_mb()
    start = time.perf_counter()
    env = trading.TradingEnv(data=data)
    seconds = time.perf_counter() - start
    # What was read, so the sources can be checked to hold the same bars.
    digest = (int(env.market.time_ns.sum()), float(env.market.close.sum()))
    queue.put((seconds, env.market.data.bar_count, high_water_mb() - before, digest))


def measure(data: str, repeats: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    runs = []
    for _ in range(repeats):
        queue = context.Queue()
        child = context.Process(target=timed_read, args=(data, queue))
        child.start()
        runs.append(queue.get(timeout=600))
        child.join()
    seconds = [r[0] for r in runs]
    return {
        "median_s": float(np.median(seconds)),
        "min_s": min(seconds),
        "bars": runs[0][1],
        "peak_mb_added": float(np.median([r[2] for r in runs])),
        "digest": runs[0][3],
    }


def driver_seconds(server: Any) -> dict[str, float]:
    """The PostgreSQL read alone, without checks or features, by each driver."""
    import psycopg  # noqa: PLC0415

    from fedrl.envs.market_source import MarketSource, read_source  # noqa: PLC0415

    columns = "timestamp, open, high, low, close, volume"
    query = f"SELECT symbol, {columns} FROM historical_bars ORDER BY symbol, timestamp"
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    read_source(server.url(), MarketSource())
    seconds["fedrl (psycopg binary COPY + numpy)"] = time.perf_counter() - start
    start = time.perf_counter()
    with psycopg.connect(server.conninfo()) as connection:
        rows = connection.execute(query).fetchall()
    seconds["psycopg fetchall() (a tuple per row)"] = time.perf_counter() - start
    del rows
    try:
        import connectorx  # noqa: PLC0415
    except ImportError:
        return seconds
    uri = (
        f"postgresql://{server.user}:{server.password}@{server.host}:{server.port}/"
        f"{server.database}"
    )
    start = time.perf_counter()
    connectorx.read_sql(uri, query, return_type="arrow")
    seconds["connectorx to Arrow"] = time.perf_counter() - start
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 bars, one read each")
    parser.add_argument("--repeats", type=int, default=3, help="reads per source (median)")
    parser.add_argument("--drivers", action="store_true", help="also time the drivers' reads")
    args = parser.parse_args()
    total = 100_000 if args.quick else 1_000_000
    repeats = 1 if args.quick else args.repeats
    reason = unavailable_reason()
    if reason is not None:
        # `make bench` runs every bench: a machine without PostgreSQL skips this one, saying why.
        print(f"skipped: no PostgreSQL server here: {reason}")
        print(json.dumps({"bench": "market_data", "quick": args.quick, "skipped": reason}))
        return

    columns = make_bars(total)
    with tempfile.TemporaryDirectory() as folder, running_postgres() as server:
        work = Path(folder)
        csv, copy_text, parquet = work / "bars.csv", work / "bars.copy", work / "bars.parquet"
        write_text(columns, csv, postgres=False)
        write_text(columns, copy_text, postgres=True)
        load_postgres(server.conninfo(), copy_text)
        import pyarrow as pa  # noqa: PLC0415
        import pyarrow.parquet as pq  # noqa: PLC0415

        table = pa.table(
            {
                "symbol": columns["symbol"],
                "timestamp": pa.array(columns["time_ns"], pa.timestamp("ns", tz="UTC")),
                **{n: columns[n] for n in ("open", "high", "low", "close", "volume")},
            }
        )
        pq.write_table(table, parquet)
        os.environ["PGPASSWORD"] = server.password
        figures = {
            "postgresql": measure(server.url(), repeats),
            "csv": measure(str(csv), repeats),
            "parquet": measure(str(parquet), repeats),
        }
        drivers = driver_seconds(server) if args.drivers else {}
    digests = {name: f.pop("digest") for name, f in figures.items()}
    if len(set(digests.values())) != 1:
        raise SystemExit(f"the sources hold different bars: {digests}")

    print(f"{total:,} bars of {len(SYMBOLS)} symbols into fedrl/Trading-v0 (read + features)")
    print(f"{'source':<12}{'median s':>10}{'min s':>10}{'peak MB added':>16}")
    for name, f in figures.items():
        print(f"{name:<12}{f['median_s']:>10.2f}{f['min_s']:>10.2f}{f['peak_mb_added']:>16.0f}")
    for name, seconds in drivers.items():
        print(f"PostgreSQL read alone, {name}: {seconds:.2f} s")
    summary = {"bench": "market_data", "quick": args.quick, "bars": total, "sources": figures}
    print(json.dumps({**summary, "drivers_s": drivers}))


if __name__ == "__main__":
    main()
