"""Market files beside CSV: Parquet and Arrow, many symbols, indicators, selection, fallback."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import feather

from fedrl.client.commands.cli import main
from fedrl.client.federation.model_spec import model_spec
from fedrl.common.spec import spec_hash
from fedrl.envs import postgres_bars
from fedrl.envs.bars import MarketDataError, MarketDataUnavailableError
from fedrl.envs.columnar_bars import load_columnar
from fedrl.envs.features import FEATURE_NAMES, WARMUP
from fedrl.envs.market_source import MarketSource, load_market_data, resample
from fedrl.envs.synthetic import synthetic_bars
from fedrl.envs.trading import TradingEnv
from fedrl.envs.trading_vector import TradingVectorEnv
from tests.support.ports import free_port

N = 1_200
SYMBOLS = ("BBB", "AAA")  # out of order on purpose: markets keep symbols sorted


def table_of(symbols: tuple[str, ...] = ("",), n: int = N, rsi_gap: int = 0) -> pa.Table:
    """Bars of `symbols` (seed = position), as a table with epoch-ms times and an rsi column."""
    parts: dict[str, list[object]] = {
        k: [] for k in ("symbol", "timestamp", "open", "high", "low", "close", "volume", "rsi")
    }
    for seed, symbol in enumerate(symbols):
        bars = synthetic_bars(n, seed)
        rsi = 50 + 10 * np.sin(np.arange(n) / 9)
        parts["symbol"] += [symbol] * n
        parts["timestamp"] += (bars.time_ns // 1_000_000).tolist()
        for name in ("open", "high", "low", "close", "volume"):
            parts[name] += getattr(bars, name).tolist()
        parts["rsi"] += [None if rsi_gap and i % rsi_gap == 0 else v for i, v in enumerate(rsi)]
    if symbols == ("",):
        del parts["symbol"]
    return pa.table(parts)


def write_csv(table: pa.Table, path: Path) -> Path:
    columns = table.column_names
    rows = zip(*(table.column(c).to_pylist() for c in columns), strict=True)
    lines = [",".join(_text(v) for v in row) for row in rows]
    path.write_text(",".join(columns) + "\n" + "\n".join(lines) + "\n")
    return path


def _text(value: object) -> str:
    # repr of a Python float reads back to the same float64.
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)


def observations(data: Path, **options: object) -> np.ndarray:
    env = TradingEnv(data=str(data), episode_length=64, **options)  # type: ignore[arg-type]
    out = []
    for seed in range(4):
        obs, _ = env.reset(seed=seed)
        out.append(obs)
        for action in (2, 0, 1, 2):
            out.append(env.step(action)[0])
    return np.array(out)


@pytest.mark.parametrize("kind", ["parquet", "arrow", "feather"])
def test_a_columnar_file_of_the_same_bars_gives_the_same_observations_as_its_csv(
    tmp_path: Path, kind: str
) -> None:
    table = table_of(SYMBOLS, rsi_gap=7)
    csv = write_csv(table, tmp_path / "bars.csv")
    path = tmp_path / f"bars.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    elif kind == "arrow":
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table)
    else:
        feather.write_feather(table, path)

    expected = observations(csv, indicators=("rsi",))
    got = observations(path, indicators=("rsi",))

    np.testing.assert_array_equal(got, expected)
    assert got.shape[1] == 32 * (len(FEATURE_NAMES) + 1) + 2


def test_timestamp_typed_parquet_reads_like_epoch_numbers(tmp_path: Path) -> None:
    table = table_of()
    typed = table.set_column(
        table.column_names.index("timestamp"),
        "timestamp",
        pa.array(np.array(table.column("timestamp").to_pylist()) * 1_000_000).cast(
            pa.timestamp("ns", tz="UTC")
        ),
    )
    pq.write_table(table, tmp_path / "ms.parquet")
    pq.write_table(typed, tmp_path / "typed.parquet")

    (ms,) = load_columnar(tmp_path / "ms.parquet").series
    (ts,) = load_columnar(tmp_path / "typed.parquet").series

    np.testing.assert_array_equal(ms.time_ns, ts.time_ns)
    np.testing.assert_array_equal(ms.close, synthetic_bars(N, 0).close)


def test_columnar_errors_name_the_file_row_and_problem(tmp_path: Path) -> None:
    table = table_of()
    close = table.column("close").to_pylist()
    close[5] = None
    at = table.column_names.index("close")
    pq.write_table(table.set_column(at, "close", pa.array(close)), tmp_path / "null.parquet")
    pq.write_table(table.drop_columns(["volume"]), tmp_path / "narrow.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")

    with pytest.raises(MarketDataError, match=r"null\.parquet row 6: missing value \(NULL"):
        load_columnar(tmp_path / "null.parquet")
    with pytest.raises(MarketDataError, match=r"narrow\.parquet: missing column\(s\): volume"):
        load_columnar(tmp_path / "narrow.parquet")
    with pytest.raises(MarketDataError, match=r"junk\.parquet: not a readable Parquet"):
        load_columnar(tmp_path / "junk.parquet")


@settings(max_examples=30, deadline=None)
@given(
    closes=st.lists(st.floats(1e-3, 1e6, allow_subnormal=False), min_size=2, max_size=30),
    symbols=st.lists(st.sampled_from(["A", "B", "C"]), min_size=30, max_size=30),
    shuffle=st.randoms(use_true_random=False),
)
def test_any_valid_rows_survive_a_round_trip_through_parquet(
    tmp_path_factory: pytest.TempPathFactory,
    closes: list[float],
    symbols: list[str],
    shuffle: object,
) -> None:
    rows = list(enumerate(closes))
    shuffle.shuffle(rows)  # type: ignore[attr-defined]
    table = pa.table(
        {
            "Symbol": [symbols[i] for i, _ in rows],
            "time": [1_700_000_000 + 60 * i for i, _ in rows],
            "open": [c for _, c in rows],
            "high": [c * 2 for _, c in rows],
            "low": [c / 2 for _, c in rows],
            "close": [c for _, c in rows],
            "volume": [float(i) for i, _ in rows],
        }
    )
    path = tmp_path_factory.mktemp("roundtrip") / "bars.parquet"
    pq.write_table(table, path)

    try:
        market = load_columnar(path)
    except MarketDataError as err:
        # A symbol with one bar is the only way these rows can be unusable.
        assert "needs at least 2 bars" in str(err)
        return

    for bars in market.series:
        picked = [i for i in range(len(closes)) if symbols[i] == bars.symbol]
        assert (bars.time_ns // 1_000_000_000).tolist() == [1_700_000_000 + 60 * i for i in picked]
        assert bars.close.tolist() == [closes[i] for i in picked]


def test_many_symbols_train_one_env_each_episode_on_a_drawn_symbol(tmp_path: Path) -> None:
    path = tmp_path / "bars.parquet"
    pq.write_table(table_of(SYMBOLS), path)
    env = TradingVectorEnv(num_envs=8, data=str(path), episode_length=32, eval_fraction=0.25)

    env.reset(seed=3)
    seen: set[int] = set()
    for _ in range(200):
        env.step(np.zeros(8, dtype=np.int64))
        bars = env._book.bar
        # Every env stays inside one symbol's training split.
        symbol = np.searchsorted(env.market.offsets, bars, side="right") - 1
        assert np.all(bars < env.market.split_at[symbol])
        assert np.all(bars - env.market.offsets[symbol] >= WARMUP + 32 - 1)
        seen |= set(symbol.tolist())

    assert env.market.symbols == ("AAA", "BBB") and seen == {0, 1}


def test_evaluation_split_is_the_latest_bars_of_every_symbol(tmp_path: Path) -> None:
    path = tmp_path / "bars.parquet"
    pq.write_table(table_of(SYMBOLS), path)
    env = TradingEnv(data=str(path), split="eval", episode_length=None, eval_fraction=0.25)

    for symbol in ("AAA", "BBB"):
        _, info = env.reset(seed=0, options={"symbol": symbol})
        first = info["time_ns"]
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(1)
            done = terminated or truncated
        assert info["symbol"] == symbol
        assert first == synthetic_bars(N, 0).time_ns[N - N // 4]
        assert info["time_ns"] == synthetic_bars(N, 0).time_ns[-1]


def test_indicator_feature_carries_the_last_known_value_and_reports_the_gaps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gappy, full = table_of(rsi_gap=5), table_of()
    rsi = np.array(full.column("rsi").to_pylist())
    carried = rsi.copy()
    carried[5::5] = rsi[4:-1:5]  # each gap holds the value before it
    carried[0] = np.nan  # nothing is known before the first value
    filled = full.set_column(full.column_names.index("rsi"), "rsi", pa.array(carried))
    pq.write_table(gappy, tmp_path / "gappy.parquet")
    pq.write_table(filled, tmp_path / "filled.parquet")

    with caplog.at_level("WARNING"):
        env = TradingEnv(data=str(tmp_path / "gappy.parquet"), indicators=("rsi",))
    reference = TradingEnv(data=str(tmp_path / "filled.parquet"), indicators=("rsi",))

    np.testing.assert_array_equal(env.market.features, reference.market.features)
    assert f"{N // 5} of {N} values missing in indicator 'rsi'" in caplog.text


def test_symbols_range_and_timeframe_select_the_bars(tmp_path: Path) -> None:
    path = tmp_path / "bars.parquet"
    pq.write_table(table_of(SYMBOLS), path)
    hourly = synthetic_bars(N, SYMBOLS.index("BBB"))

    market = load_market_data(
        str(path),
        MarketSource(symbols=("BBB",), start="2020-01-02", end="2020-01-04", timeframe="1d"),
        seed=0,
        synthetic_count=10,
    )

    (bars,) = market.series
    assert bars.symbol == "BBB" and len(bars) == 2
    day = slice(24, 48)
    assert bars.open[0] == hourly.open[day][0] and bars.close[0] == hourly.close[day][-1]
    assert bars.high[0] == hourly.high[day].max()
    assert bars.volume[0] == pytest.approx(hourly.volume[day].sum(), rel=1e-12)


def test_a_finer_timeframe_than_the_bars_is_refused() -> None:
    with pytest.raises(MarketDataError, match="bars are 1h apart; --timeframe 15min cannot"):
        resample(synthetic_bars(100, 0), 15 * 60 * 10**9, "15min")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeframe": "5 parsecs"}, "expected a count and a unit"),
        ({"start": "yesterday"}, "expected an ISO 8601 time"),
        ({"start": "2024-02-01", "end": "2024-01-01"}, "must come before end"),
        ({"columns": ("price=close",)}, "expected ROLE=NAME"),
        ({"query": "SELECT 1", "table": "bars"}, "give --table or --query, not both"),
    ],
)
def test_bad_source_options_are_refused_with_the_reason(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        MarketSource(**options)  # type: ignore[arg-type]


def test_file_sources_refuse_database_options(tmp_path: Path) -> None:
    path = write_csv(table_of(), tmp_path / "bars.csv")

    with pytest.raises(ValueError, match="--indicator-table read a PostgreSQL table"):
        load_market_data(str(path), MarketSource(indicator_table="t"), seed=0, synthetic_count=9)


def test_a_missing_file_is_an_error_even_with_the_fallback(tmp_path: Path) -> None:
    # A typo in a path is not an outage: it must not turn into a synthetic run.
    options = MarketSource(fallback="synthetic")

    with pytest.raises(MarketDataError, match="cannot read the file"):
        load_market_data(str(tmp_path / "nope.csv"), options, seed=0, synthetic_count=9)
    with pytest.raises(MarketDataUnavailableError):
        load_market_data(
            f"postgresql://x@127.0.0.1:{free_port()}/db", MarketSource(), seed=0, synthetic_count=9
        )


def train(tmp_path: Path, *extra: str) -> Result:
    """The client's training command, in this process (the env is registered already)."""
    return CliRunner().invoke(
        main,
        [
            "--offline", "--participant-id", "p", "--state-dir", str(tmp_path / "state"),
            "--env", "fedrl/Trading-v0", "--episodes", "1", "--workers", "0",
            "--envs-per-worker", "1", "--learning-starts", "128", "--eval-interval", "0", *extra,
        ],
    )  # fmt: skip


def test_only_fallback_synthetic_trains_on_synthetic_bars_when_data_is_given(
    tmp_path: Path,
) -> None:
    down = f"postgresql://nobody@127.0.0.1:{free_port()}/market"

    refused = train(tmp_path, "--data", down)
    trained_nothing = not (tmp_path / "state" / "p").exists()
    fallen = train(tmp_path, "--data", down, "--fallback", "synthetic", "--log-interval", "0.01")

    assert refused.exit_code == 1 and "cannot reach the server" in refused.output
    assert "--fallback synthetic" in refused.output and trained_nothing
    assert fallen.exit_code == 0, fallen.output
    assert "train SYNTHETIC-DATA" in fallen.output
    records = [json.loads(line) for line in (tmp_path / "state/p/metrics.jsonl").open()]
    assert records and all(r["synthetic_data"] is True for r in records)
    saved = torch.load(tmp_path / "state/p/model.pt", weights_only=True)
    assert saved["data"]["synthetic"] is True
    assert "cannot reach the server" in saved["data"]["source"]


def copy_stream(rows: np.ndarray) -> bytes:
    """PostgreSQL's binary COPY of `rows` (a structured array laid out as parse_rows reads)."""
    header = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
    return header + rows.tobytes() + b"\xff\xff"


@settings(max_examples=40, deadline=None)
@given(
    count=st.integers(0, 300),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    values=st.floats(allow_nan=True, allow_infinity=False, width=64),
)
def test_binary_copy_parses_the_same_whatever_the_message_boundaries(
    count: int, cuts: list[int], values: float
) -> None:
    dtype = postgres_bars.copy_row_dtype(indicators=1, time_type=">i8")
    rows = np.zeros(count, dtype=dtype)
    for name in dtype.names or ():
        if name.endswith("_length"):
            rows[name] = dtype[name.removesuffix("_length")].itemsize
    rows["count"] = (len(dtype.names or ()) - 1) // 2
    rows["time"] = np.arange(count)
    rows["close"] = values
    stream = copy_stream(rows)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    blocks = [memoryview(stream[a:b]) for a, b in itertools.pairwise(points)]

    parsed = postgres_bars.parse_rows(blocks, dtype, "db")

    for name in dtype.names or ():
        np.testing.assert_array_equal(parsed[name], rows[name])
    with pytest.raises(MarketDataError, match="ended mid-row"):
        postgres_bars.parse_rows([memoryview(stream[:-3])], dtype, "db")


def test_the_model_spec_does_not_depend_on_the_symbols(tmp_path: Path) -> None:
    # Two traders with different symbols (and histories) must be able to share a session.
    pq.write_table(table_of(("AAA",), n=1_000), tmp_path / "a.parquet")
    pq.write_table(table_of(("XXX", "YYY"), n=1_400), tmp_path / "b.parquet")
    weights = [("w", np.zeros((4, 4), np.float32))]

    specs = [
        model_spec("fedrl/Trading-v0", weights, "dqn", data=str(tmp_path / name))
        for name in ("a.parquet", "b.parquet")
    ]

    assert spec_hash(specs[0]) == spec_hash(specs[1])
