"""Reading OHLCV CSV files: the common layouts parse, every malformed case names file and line."""

from __future__ import annotations

import datetime as dt
import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrl.envs.bars import MarketDataError
from fedrl.envs.csv_bars import load_csv

# 2024-01-01T00:00:00Z and the next two hours.
T0 = 1_704_067_200
HOURS = [T0, T0 + 3600, T0 + 7200]
ISO = ["2024-01-01T00:00:00Z", "2024-01-01T01:00:00Z", "2024-01-01T02:00:00Z"]
OHLCV = ["10,12,9,11,100", "11,13,10,12,150", "12,12.5,11,11.5,80"]


def write(tmp_path: Path, text: str, name: str = "bars.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def expect_default_bars(bars_time_ns: np.ndarray, close: np.ndarray) -> None:
    assert bars_time_ns.tolist() == [t * 1_000_000_000 for t in HOURS]
    assert close.tolist() == [11.0, 12.0, 11.5]


@pytest.mark.parametrize(
    ("header", "times"),
    [
        ("timestamp,open,high,low,close,volume", [str(t) for t in HOURS]),
        ("Date,Open,High,Low,Close,Volume", ISO),
        ("time,OPEN,High,low,CLOSE,volume", ["2024-01-01 00:00:00", "2024-01-01 01:00", ISO[2]]),
        ("datetime,open,high,low,close,volume", [f"{t}000000" for t in HOURS]),  # microseconds
        ("timestamp,open,high,low,close,volume", [f"{t}000000000" for t in HOURS]),  # nanoseconds
    ],
)
def test_common_time_layouts_parse_to_the_same_bars(
    tmp_path: Path, header: str, times: list[str]
) -> None:
    path = write(
        tmp_path, "\n".join([header, *(f"{t},{r}" for t, r in zip(times, OHLCV, strict=True))])
    )

    (bars,) = load_csv(path).series

    expect_default_bars(bars.time_ns, bars.close)


def test_millisecond_epochs_with_extra_columns_parse(tmp_path: Path) -> None:
    # Binance kline layout: open_time in ms and six more columns we do not use.
    header = (
        "open_time,open,high,low,close,volume,close_time,quote_volume,count,"
        "taker_buy_volume,taker_buy_quote_volume,ignore"
    )
    rows = [f"{t}000,{r},{t}999,1.5,7,0.5,0.7,0" for t, r in zip(HOURS, OHLCV, strict=True)]
    path = write(tmp_path, "\n".join([header, *rows]) + "\n")

    (bars,) = load_csv(path).series

    expect_default_bars(bars.time_ns, bars.close)
    assert bars.volume.tolist() == [100.0, 150.0, 80.0]
    assert bars.high.tolist() == [12.0, 13.0, 12.5]


def test_gzip_is_recognised_by_content_not_name(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "timestamp,open,high,low,close,volume",
            *(f"{t},{r}" for t, r in zip(HOURS, OHLCV, strict=True)),
        ]
    )
    path = tmp_path / "bars.csv"
    path.write_bytes(gzip.compress(text.encode()))

    (bars,) = load_csv(path).series

    expect_default_bars(bars.time_ns, bars.close)


def test_semicolon_delimiter_bom_and_blank_lines_are_accepted(tmp_path: Path) -> None:
    rows = [f"{t};{r.replace(',', ';')}" for t, r in zip(HOURS, OHLCV, strict=True)]
    path = tmp_path / "bars.csv"
    path.write_bytes(
        ("\ufefftimestamp;open;high;low;close;volume\n" + "\n\n".join(rows) + "\n\n").encode()
    )

    (bars,) = load_csv(path).series

    expect_default_bars(bars.time_ns, bars.close)


def test_rows_are_sorted_by_time_and_duplicate_timestamps_keep_the_last_row(
    tmp_path: Path,
) -> None:
    # Newest first, and the first hour appears twice: the later line is the correction.
    path = write(
        tmp_path,
        "\n".join(
            [
                "timestamp,open,high,low,close,volume",
                f"{HOURS[2]},{OHLCV[2]}",
                f"{HOURS[0]},10,12,9,10.5,1",
                f"{HOURS[1]},{OHLCV[1]}",
                f"{HOURS[0]},{OHLCV[0]}",
            ]
        ),
    )

    (bars,) = load_csv(path).series

    expect_default_bars(bars.time_ns, bars.close)
    assert bars.volume.tolist() == [100.0, 150.0, 80.0]


def test_gaps_are_kept_as_they_are(tmp_path: Path) -> None:
    times = [T0, T0 + 3600, T0 + 10 * 3600]
    path = write(
        tmp_path,
        "\n".join(
            [
                "timestamp,open,high,low,close,volume",
                *(f"{t},{r}" for t, r in zip(times, OHLCV, strict=True)),
            ]
        ),
    )

    (bars,) = load_csv(path).series

    assert (bars.time_ns // 1_000_000_000).tolist() == times


def test_loaded_arrays_are_read_only(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "\n".join(
            [
                "timestamp,open,high,low,close,volume",
                *(f"{t},{r}" for t, r in zip(HOURS, OHLCV, strict=True)),
            ]
        ),
    )

    (bars,) = load_csv(path).series

    with pytest.raises(ValueError, match="read-only"):
        bars.close[0] = 1.0


GOOD_HEADER = "timestamp,open,high,low,close,volume"


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        (["timestamp,open,high,low,close", f"{T0},1,2,0.5,1"], 1, "missing column(s): volume"),
        (
            ["when,open,high,low,close,volume", f"{T0},1,2,0.5,1,1"],
            1,
            "missing column(s): a time column (timestamp/open_time/datetime/date/time)",
        ),
        (
            [GOOD_HEADER, f"{T0},{OHLCV[0]}", f"{T0 + 3600},11,13,10,abc,5"],
            3,
            "non-numeric value 'abc' in column 'close'",
        ),
        (
            [GOOD_HEADER, f"{T0},{OHLCV[0]}", f"{T0 + 3600},11,13,10,,5"],
            3,
            "an empty value in column 'close'",
        ),
        (
            [GOOD_HEADER, f"{T0},{OHLCV[0]}", f"{T0 + 3600},11,9,10,10,5"],
            3,
            "high 9 is below low 10",
        ),
        (
            [GOOD_HEADER, f"{T0},{OHLCV[0]}", f"{T0 + 3600},0,13,10,12,5"],
            3,
            "non-positive price 0 in column 'open'",
        ),
        (
            [GOOD_HEADER, f"{T0},{OHLCV[0]}", f"{T0 + 3600},11,13,-1,12,5"],
            3,
            "non-positive price -1 in column 'low'",
        ),
        (
            [GOOD_HEADER, f"{T0},{OHLCV[0]}", f"{T0 + 3600},11,13,10,nan,5"],
            3,
            "non-finite value 'nan' in column 'close'",
        ),
        ([GOOD_HEADER, f"{T0},{OHLCV[0]}", f"{T0 + 3600},11,13,10,12,-5"], 3, "negative volume -5"),
        (
            ["date,open,high,low,close,volume", f"{ISO[0]},{OHLCV[0]}", f"31/01/2024,{OHLCV[1]}"],
            3,
            "cannot read '31/01/2024' as a time",
        ),
        (
            [GOOD_HEADER, f"{T0},{OHLCV[0]}", f"{T0 + 3600},11,13,10"],
            3,
            "row has 4 fields, but the header puts column 'volume' at field 6",
        ),
        (
            [f"{T0},{OHLCV[0]}", f"{T0 + 3600},{OHLCV[1]}"],
            1,
            "the first line holds values, not column names",
        ),
        ([GOOD_HEADER, f"{T0},{OHLCV[0]}"], None, "needs at least 2 bars, found 1"),
        (["", "  "], None, "empty file"),
        (["", "open,high,low,close,volume", "1,1,1,1,1"], 2, "missing column(s): a time column"),
    ],
    ids=[
        "missing-volume",
        "missing-time",
        "non-numeric",
        "empty-value",
        "high-below-low",
        "zero-price",
        "negative-price",
        "nan",
        "negative-volume",
        "bad-time",
        "short-row",
        "no-header",
        "one-bar",
        "empty",
        "header-after-blank-line",
    ],
)
def test_malformed_file_error_names_file_line_and_problem(
    tmp_path: Path, lines: list[str], line: int | None, message: str
) -> None:
    path = write(tmp_path, "\n".join(lines) + "\n")

    with pytest.raises(MarketDataError) as caught:
        load_csv(path)

    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert str(caught.value).startswith(where), str(caught.value)
    assert message in str(caught.value)


def test_first_bad_row_in_file_order_is_reported(tmp_path: Path) -> None:
    # Line 3 has high < low, line 4 a zero price: the earlier line is the one to fix first.
    path = write(
        tmp_path,
        "\n".join(
            [GOOD_HEADER, f"{T0},{OHLCV[0]}", f"{T0 + 1},11,9,10,10,5", f"{T0 + 2},0,1,1,1,1"]
        ),
    )

    with pytest.raises(MarketDataError, match=r":3: high 9 is below low 10"):
        load_csv(path)


def test_missing_file_and_corrupt_gzip_are_named(tmp_path: Path) -> None:
    corrupt = tmp_path / "cut.csv.gz"
    corrupt.write_bytes(gzip.compress(b"timestamp,open,high,low,close,volume\n" * 50)[:30])

    with pytest.raises(MarketDataError, match=r"nope\.csv: cannot read the file"):
        load_csv(tmp_path / "nope.csv")
    with pytest.raises(MarketDataError, match=r"cut\.csv\.gz: corrupt or truncated gzip"):
        load_csv(corrupt)


def test_binary_file_is_refused_as_not_text(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04\xff\xfe\x00garbage")

    with pytest.raises(MarketDataError, match=r"model\.pt: not UTF-8 text"):
        load_csv(path)


def test_line_numbers_count_blank_lines_and_multiline_fields(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "\n".join(
            [
                "timestamp,open,high,low,close,volume,note",
                f'{T0},{OHLCV[0]},"two',
                'lines"',
                "",
                f"{T0 + 3600},11,13,10,oops,5,x",
            ]
        ),
    )

    with pytest.raises(MarketDataError, match=r"bars\.csv:5: non-numeric value 'oops'"):
        load_csv(path)


@settings(max_examples=25, deadline=None)
@given(
    # From March 1973: earlier epoch milliseconds are below 1e11 and read as seconds.
    start=st.integers(100_000_000, 4_000_000_000),
    spacing=st.sampled_from([60, 3_600, 86_400]),
    closes=st.lists(st.floats(1e-6, 1e9, allow_subnormal=False), min_size=2, max_size=40),
    unit=st.sampled_from(["s", "ms", "iso"]),
)
def test_any_valid_bars_survive_a_round_trip_through_csv(
    tmp_path_factory: pytest.TempPathFactory,
    start: int,
    spacing: int,
    closes: list[float],
    unit: str,
) -> None:
    times = [start + i * spacing for i in range(len(closes))]
    shown = {
        "s": [str(t) for t in times],
        "ms": [str(t * 1000) for t in times],
        "iso": [dt.datetime.fromtimestamp(t, dt.UTC).isoformat() for t in times],
    }[unit]
    rows = [
        f"{t},{c!r},{c * 1.5!r},{c / 2!r},{c!r},{i}"
        for i, (t, c) in enumerate(zip(shown, closes, strict=True))
    ]
    path = tmp_path_factory.mktemp("roundtrip") / "bars.csv"
    path.write_text("timestamp,open,high,low,close,volume\n" + "\n".join(rows))

    (bars,) = load_csv(path).series

    assert (bars.time_ns // 1_000_000_000).tolist() == times
    assert bars.close.tolist() == closes
    assert bars.volume.tolist() == list(range(len(closes)))
