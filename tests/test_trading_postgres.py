"""fedrl/Trading-v0 on bars in a real PostgreSQL server that this module starts itself.

Three symbols of 10,000 hourly bars in `historical_bars` and their indicators in
`technical_indicators`, as trading users keep them; the client reads them with libpq's own
PGPASSWORD (never a password in --data), trains, evaluates and backtests on them, and every
broken table gives a one-line error that names the problem.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from fedrl.client.commands.backtest import make_backtest_command
from fedrl.client.commands.cli import main
from fedrl.envs.bars import MarketData, MarketDataError, MarketDataUnavailableError
from fedrl.envs.market_source import MarketSource, load_market_data
from fedrl.envs.synthetic import synthetic_bars
from tests.support.ports import free_port
from tests.support.postgres import PASSWORD, Postgres, running_postgres, unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
psycopg = pytest.importorskip("psycopg", reason="the trading extra (psycopg) is not installed")

SYMBOLS = ("AAPL", "MSFT", "NVDA")
BARS = 10_000


def copy_rows(
    connection: psycopg.Connection[tuple[object, ...]], table: str, rows: list[str]
) -> None:
    with connection.cursor().copy(f"COPY {table} FROM STDIN") as copy:
        copy.write("".join(rows))


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    """The server with three symbols' bars and indicators (every 50th RSI missing)."""
    with running_postgres() as pg, psycopg.connect(pg.conninfo()) as connection:
        connection.execute(
            "CREATE TABLE historical_bars (symbol text, timestamp timestamptz, open float8, "
            "high float8, low float8, close float8, volume float8, PRIMARY KEY (symbol, timestamp))"
        )
        connection.execute(
            "CREATE TABLE technical_indicators (symbol text, timestamp timestamptz, "
            "rsi_14 float8, sma_gap float8)"
        )
        bars, indicators = [], []
        for seed, symbol in enumerate(SYMBOLS):
            b = synthetic_bars(BARS, seed)
            times = b.time_ns.astype("datetime64[ns]").astype(str)
            # repr of a Python float reads back to the same float64.
            columns = zip(b.open.tolist(), b.high.tolist(), b.low.tolist(), b.close.tolist(),
                          b.volume.tolist(), strict=True)  # fmt: skip
            for i, (o, h, lo, c, v) in enumerate(columns):
                t = f"{times[i]}+00"
                bars.append(f"{symbol}\t{t}\t{o!r}\t{h!r}\t{lo!r}\t{c!r}\t{v!r}\n")
                rsi = "\\N" if i % 50 == 0 else f"{50 + 10 * np.sin(i / 7):.4f}"
                indicators.append(f"{symbol}\t{t}\t{rsi}\t{np.cos(i / 11):.4f}\n")
        copy_rows(connection, "historical_bars", bars)
        copy_rows(connection, "technical_indicators", indicators)
        connection.commit()
        yield pg


@pytest.fixture(autouse=True)
def password(monkeypatch: pytest.MonkeyPatch) -> None:
    """libpq reads the password from the environment, as psql does."""
    monkeypatch.setenv("PGPASSWORD", PASSWORD)


def make_table(server: Postgres, name: str, rows: list[str]) -> None:
    with psycopg.connect(server.conninfo()) as connection:
        connection.execute(f"DROP TABLE IF EXISTS {name}")
        connection.execute(
            f"CREATE TABLE {name} (symbol text, timestamp timestamptz, open float8, "
            "high float8, low float8, close float8, volume float8)"
        )
        if rows:
            copy_rows(connection, name, rows)


def good_rows(symbol: str = "AAPL", count: int = 5) -> list[str]:
    return [f"{symbol}\t2024-01-01 {h:02d}:00+00\t10\t11\t9\t10.5\t100\n" for h in range(count)]


def read(server: Postgres, **options: Any) -> MarketData:
    return load_market_data(
        server.url(),
        MarketSource(**options),
        seed=0,
        synthetic_count=1_000,  # type: ignore[arg-type]
    )


def test_three_symbols_and_their_indicators_arrive_exactly(server: Postgres) -> None:
    market = read(server, indicator_table="technical_indicators")

    assert market.symbols == SYMBOLS and not market.synthetic
    assert market.indicator_names == ("rsi_14", "sma_gap")
    for seed, bars in enumerate(market.series):
        expected = synthetic_bars(BARS, seed)
        np.testing.assert_array_equal(bars.time_ns, expected.time_ns)
        np.testing.assert_array_equal(bars.close, expected.close)
        np.testing.assert_array_equal(bars.volume, expected.volume)
        assert int(np.isnan(bars.indicators["rsi_14"]).sum()) == BARS // 50


def test_symbols_range_and_timeframe_are_chosen_in_the_read(server: Postgres) -> None:
    market = read(
        server,
        symbols=("NVDA,AAPL",),
        start="2020-01-02",
        end="2020-01-03",
        timeframe="4h",
    )

    assert market.symbols == ("AAPL", "NVDA")
    hourly = synthetic_bars(BARS, 0)
    day = (hourly.time_ns >= 1_577_923_200 * 10**9) & (hourly.time_ns < 1_578_009_600 * 10**9)
    (aapl, _) = market.series
    assert len(aapl) == 6
    np.testing.assert_array_equal(aapl.close, hourly.close[day][3::4])
    np.testing.assert_array_equal(aapl.high, hourly.high[day].reshape(6, 4).max(axis=1))


@pytest.mark.parametrize(
    ("setup", "options", "message"),
    [
        ("wrong-password", {}, "cannot log in: password authentication failed"),
        ("none", {"table": "no_such_table"}, 'relation "no_such_table" does not exist'),
        ("none", {"columns": ("close=adj_close",)}, "missing column(s): adj_close"),
        ("nulls", {"table": "bars_with_nulls"}, "missing value (NULL or NaN) in column 'close'"),
        ("duplicates", {"table": "bars_twice"}, "2 duplicate timestamps for AAPL"),
        ("none", {"symbols": ("AAPL", "XXX")}, "no bars for symbol(s) XXX"),
        ("none", {"query": "SELECT nonsense FROM"}, "syntax error"),
    ],
    ids=[
        "wrong-password",
        "missing-table",
        "missing-column",
        "nulls",
        "duplicates",
        "unknown-symbol",
        "bad-query",
    ],
)
def test_broken_source_gives_one_line_naming_the_problem(
    server: Postgres,
    monkeypatch: pytest.MonkeyPatch,
    setup: str,
    options: dict[str, object],
    message: str,
) -> None:
    if setup == "wrong-password":
        monkeypatch.setenv("PGPASSWORD", "not-it")
    if setup == "nulls":
        rows = good_rows()
        rows[3] = "AAPL\t2024-01-01 03:00+00\t10\t11\t9\t\\N\t100\n"
        make_table(server, "bars_with_nulls", rows)
    if setup == "duplicates":
        make_table(server, "bars_twice", good_rows() + good_rows(count=2))

    with pytest.raises(MarketDataError) as caught:
        read(server, **options)

    text = str(caught.value)
    assert message in text and "\n" not in text, text
    assert text.startswith(server.url()), text
    assert not isinstance(caught.value, MarketDataUnavailableError)


def test_null_error_names_the_symbol_and_bar(server: Postgres) -> None:
    rows = good_rows()
    rows[3] = "AAPL\t2024-01-01 03:00+00\t10\t11\t9\t\\N\t100\n"
    make_table(server, "bars_with_a_null", rows)

    with pytest.raises(MarketDataError, match=r"AAPL at 2024-01-01 03:00:00 UTC: missing value"):
        read(server, table="bars_with_a_null")


def test_nothing_is_written_even_by_a_query_that_tries(server: Postgres) -> None:
    with psycopg.connect(server.conninfo()) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS audit (n int)")
        connection.execute(
            "CREATE OR REPLACE FUNCTION sneaky() RETURNS int "
            "AS 'INSERT INTO audit VALUES (1) RETURNING 1' LANGUAGE sql"
        )
    writes = "SELECT b.* FROM historical_bars AS b CROSS JOIN sneaky() AS n"
    # A read-only transaction allows lo_create; it is never committed.
    makes = "SELECT b.* FROM historical_bars AS b CROSS JOIN lo_create(0) AS made"

    with pytest.raises(MarketDataError, match="cannot execute INSERT in a read-only transaction"):
        read(server, query=writes)
    assert len(read(server, query=makes).series) == len(SYMBOLS)

    with psycopg.connect(server.conninfo()) as connection:
        counts = [
            connection.execute(f"SELECT count(*) FROM {table}").fetchone()
            for table in ("historical_bars", "audit", "pg_largeobject_metadata")
        ]
    assert counts == [(BARS * len(SYMBOLS),), (0,), (0,)]


def test_a_password_in_the_url_is_refused(server: Postgres) -> None:
    url = server.url().replace(f"{server.user}@", f"{server.user}:{PASSWORD}@")

    hint = r"PGPASSWORD, ~/\.pgpass or a service file"
    with pytest.raises(MarketDataError, match=hint) as caught:
        load_market_data(url, MarketSource(), seed=0, synthetic_count=1_000)
    assert PASSWORD not in str(caught.value)


def test_an_empty_table_is_unavailable_and_only_the_fallback_trains_on_synthetic(
    server: Postgres,
) -> None:
    make_table(server, "empty_bars", [])

    with pytest.raises(MarketDataUnavailableError, match="--fallback synthetic"):
        read(server, table="empty_bars")
    market = read(server, table="empty_bars", fallback="synthetic")

    assert market.synthetic and "SYNTHETIC" in market.source and "no bars" in market.source


def test_an_unreachable_server_is_unavailable() -> None:
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/market"

    with pytest.raises(MarketDataUnavailableError, match="cannot reach the server"):
        load_market_data(url, MarketSource(), seed=0, synthetic_count=1_000)


def test_the_client_trains_evaluates_and_backtests_on_the_tables(
    server: Postgres, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state_dir = tmp_path / "state"
    data = ["--data", server.url(), "--indicator-table", "technical_indicators"]

    with caplog.at_level("WARNING"):
        run = CliRunner().invoke(
            main,
            [
                "--offline", "--participant-id", "p", "--state-dir", str(state_dir),
                "--env", "fedrl/Trading-v0", *data, "--episodes", "2", "--workers", "0",
                "--envs-per-worker", "2", "--learning-starts", "128", "--eval-interval", "256",
                "--eval-episodes", "1",
            ],
        )  # fmt: skip

    assert run.exit_code == 0, run.output
    assert "read 30000 bars of 3 symbol(s)" in caplog.text
    assert len(list((state_dir / "market-cache").glob("*.parquet"))) == 1
    records = [json.loads(line) for line in (state_dir / "p" / "metrics.jsonl").open()]
    assert any(r.get("kind") == "eval" for r in records), records[-3:]
    assert not any("synthetic_data" in r for r in records)
    saved = torch.load(state_dir / "p" / "model.pt", weights_only=True)
    assert saved["data"] == {"source": f"{server.url()} (table historical_bars joined with "
                             "technical_indicators)", "synthetic": False}  # fmt: skip

    result = CliRunner().invoke(
        make_backtest_command(),
        ["--model", str(state_dir / "p" / "model.pt"), *data, "--out", str(tmp_path / "e.png")],
    )

    assert result.exit_code == 0, result.output
    for symbol in (*SYMBOLS, "total (equal capital in each symbol)"):
        assert symbol in result.output
    assert "SYNTHETIC" not in result.output
