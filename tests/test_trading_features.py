"""Features are causal (no lookahead), finite, bounded and independent of the price level."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedrl.envs.bars import Bars
from fedrl.envs.features import FEATURE_CLIP, FEATURE_NAMES, WARMUP, compute_features
from fedrl.envs.synthetic import synthetic_bars
from fedrl.envs.trading import TradingEnv

N_BARS = 1_500


def perturbed_after(bars: Bars, t: int, seed: int) -> Bars:
    """`bars` with every bar after t replaced by a different, still valid bar."""
    rng = np.random.default_rng(seed)
    scale = np.ones(len(bars))
    scale[t + 1 :] = rng.uniform(0.5, 2.0, len(bars) - t - 1)
    volume = bars.volume.copy()
    volume[t + 1 :] *= rng.uniform(0.1, 10.0, len(bars) - t - 1)
    return dataclasses.replace(
        bars,
        open=bars.open * scale,
        high=bars.high * scale,
        low=bars.low * scale,
        close=bars.close * scale,
        volume=volume,
    )


@pytest.mark.parametrize("t", [WARMUP, WARMUP + 1, 900, N_BARS - 2])
def test_feature_rows_up_to_t_ignore_every_later_bar(t: int) -> None:
    bars = synthetic_bars(N_BARS, seed=11)
    original = compute_features(bars)

    changed = compute_features(perturbed_after(bars, t, seed=t))

    np.testing.assert_array_equal(changed[: t + 1], original[: t + 1])
    assert not np.array_equal(changed[t + 1 :], original[t + 1 :])


def write_csv(bars: Bars, path: Path) -> Path:
    rows = [
        f"{t // 1_000_000},{o!r},{h!r},{lo!r},{c!r},{v!r}"
        for t, o, h, lo, c, v in zip(
            bars.time_ns.tolist(),
            bars.open.tolist(),
            bars.high.tolist(),
            bars.low.tolist(),
            bars.close.tolist(),
            bars.volume.tolist(),
            strict=True,
        )
    ]
    path.write_text("timestamp,open,high,low,close,volume\n" + "\n".join(rows) + "\n")
    return path


def test_observations_up_to_t_ignore_bars_after_t(tmp_path: Path) -> None:
    # Same seed, same actions, two files that agree only up to bar t.
    bars = synthetic_bars(N_BARS, seed=5)
    options: dict[str, Any] = {"episode_length": None, "window": 8, "eval_fraction": 0.1}
    reference = TradingEnv(data=str(write_csv(bars, tmp_path / "a.csv")), **options)
    obs, info = reference.reset(seed=0)
    t = info["bar"] + 40
    changed = TradingEnv(
        data=str(write_csv(perturbed_after(bars, t, seed=1), tmp_path / "b.csv")), **options
    )
    changed_obs, _ = changed.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 3, 40)

    observed = [(obs, changed_obs)]
    for action in actions:
        obs, reward, *_ = reference.step(int(action))
        changed_obs, changed_reward, *_ = changed.step(int(action))
        observed.append((obs, changed_obs))
        assert reward == changed_reward

    for ours, theirs in observed:
        np.testing.assert_array_equal(ours, theirs)
    # Sanity: the files do differ from bar t + 1 on, for a long position and its observation.
    after, after_reward, *_ = reference.step(2)
    changed_after, changed_after_reward, *_ = changed.step(2)
    assert after_reward != changed_after_reward
    assert not np.array_equal(after, changed_after)


def test_features_are_finite_bounded_and_zero_during_warmup() -> None:
    features = compute_features(synthetic_bars(3_000, seed=2))

    assert features.shape == (3_000, len(FEATURE_NAMES))
    assert features.dtype == np.float32
    assert np.all(np.isfinite(features))
    assert np.all(np.abs(features) <= FEATURE_CLIP)
    assert not features[:WARMUP].any()
    assert np.all(features[WARMUP:].std(axis=0) > 0)


def test_features_do_not_depend_on_the_price_level() -> None:
    bars = synthetic_bars(2_000, seed=4)
    scaled = dataclasses.replace(
        bars, open=bars.open * 1e4, high=bars.high * 1e4, low=bars.low * 1e4, close=bars.close * 1e4
    )

    np.testing.assert_allclose(compute_features(scaled), compute_features(bars), atol=1e-4)


def test_flat_market_gives_finite_features() -> None:
    # A stable coin: no price moves and constant volume must not divide by zero.
    n = WARMUP + 50
    flat = np.full(n, 1.0)
    bars = Bars(
        time_ns=np.arange(n, dtype=np.int64),
        open=flat,
        high=flat.copy(),
        low=flat.copy(),
        close=flat.copy(),
        volume=np.full(n, 5.0),
        source="flat",
    )

    features = compute_features(bars)

    assert np.all(np.isfinite(features))


def test_each_feature_matches_its_textbook_formula_at_a_bar() -> None:
    bars = synthetic_bars(700, seed=8)
    close, volume = bars.close.tolist(), bars.volume.tolist()
    t = 650

    def ema(values: list[float], alpha: float) -> list[float]:
        out, level = [], values[0]
        for value in values:
            level += alpha * (value - level)
            out.append(level)
        return out

    returns = [0.0] + [math.log(b / a) for a, b in itertools.pairwise(close)]
    long_vol = math.sqrt(sum(r * r for r in returns[t - 255 : t + 1]) / 256)
    short_vol = math.sqrt(sum(r * r for r in returns[t - 19 : t + 1]) / 20)
    moves = [0.0] + [b - a for a, b in itertools.pairwise(close)]
    gain = ema([max(m, 0.0) for m in moves], 1 / 14)[t]
    loss = ema([max(-m, 0.0) for m in moves], 1 / 14)[t]
    macd = [f - s for f, s in zip(ema(close, 2 / 13), ema(close, 2 / 27), strict=True)]
    signal = ema(macd, 2 / 10)
    window = [math.log1p(v) for v in volume[t - 19 : t + 1]]
    mean = sum(window) / 20
    std = math.sqrt(sum((x - mean) ** 2 for x in window) / 20)
    expected = [
        returns[t] / long_vol,
        math.log(short_vol / long_vol),
        2 * gain / (gain + loss) - 1,
        macd[t] / (close[t] * long_vol),
        (macd[t] - signal[t]) / (close[t] * long_vol),
        (window[-1] - mean) / std,
    ]

    row = compute_features(bars)[t]

    np.testing.assert_allclose(row, np.clip(expected, -FEATURE_CLIP, FEATURE_CLIP), rtol=1e-5)
