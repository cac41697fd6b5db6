"""The synthetic market: reproducible by seed, valid bars, and the stylised facts it promises."""

from __future__ import annotations

import numpy as np

from fedrl.envs.synthetic import synthetic_bars

COLUMNS = ("time_ns", "open", "high", "low", "close", "volume")


def test_same_seed_gives_identical_bars() -> None:
    first = synthetic_bars(3_000, seed=7)
    second = synthetic_bars(3_000, seed=7)

    for name in COLUMNS:
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))


def test_different_seeds_give_different_markets() -> None:
    assert not np.array_equal(synthetic_bars(500, seed=1).close, synthetic_bars(500, seed=2).close)


def test_bars_are_consistent_hourly_ohlcv() -> None:
    bars = synthetic_bars(5_000, seed=3)

    assert np.all(np.diff(bars.time_ns) == 3_600 * 10**9)
    assert np.all(bars.low > 0)
    assert np.all(bars.high >= np.maximum(bars.open, bars.close))
    assert np.all(bars.low <= np.minimum(bars.open, bars.close))
    assert np.all(bars.volume > 0)
    assert "synthetic" in bars.source and "seed 3" in bars.source


def test_volatility_clusters() -> None:
    # GARCH's signature: large moves follow large moves, so |returns| are autocorrelated
    # while the returns themselves are not.
    bars = synthetic_bars(20_000, seed=0)
    returns = np.diff(np.log(bars.close))
    size = np.abs(returns)

    size_autocorrelation = np.corrcoef(size[1:], size[:-1])[0, 1]
    return_autocorrelation = np.corrcoef(returns[1:], returns[:-1])[0, 1]

    assert size_autocorrelation > 0.1
    assert abs(return_autocorrelation) < 0.05
