"""A seeded synthetic market: hourly OHLCV bars with regimes and clustered volatility.

Close prices follow geometric Brownian motion whose drift and volatility scale switch between
regimes (a Markov chain), and whose base volatility clusters through GARCH(1,1); shocks are
Student-t, for the fat tails of real returns. Volume rises with volatility, as it does on real
exchanges. The same seed gives the same bars on every machine (numpy's PCG64 is portable).
"""

from __future__ import annotations

import numpy as np

from fedrl.envs.bars import Bars

# Hourly bars starting 2020-01-01 UTC: the timestamps give backtests a real bars-per-year.
_START_NS = 1_577_836_800 * 1_000_000_000
_BAR_NS = 3_600 * 1_000_000_000
_HOURS_PER_YEAR = 24 * 365
_START_PRICE = 100.0
# 0.8 % per hour is about 75 % a year: the volatility of a large crypto asset.
_BASE_VOL = 0.008
# GARCH(1,1) persistence 0.98 gives volatility bursts lasting days, as in crypto markets.
_GARCH_ALPHA = 0.08
_GARCH_BETA = 0.90
# Regimes: (annual drift, volatility multiplier). Bull, bear and quiet sideways markets.
_REGIMES = np.array([(0.6, 0.9), (-0.6, 1.3), (0.0, 0.6)])
# Staying probability per bar: regimes last 500 bars (about three weeks) on average.
_REGIME_STAY = 1 - 1 / 500
_T_DOF = 5.0
_BASE_VOLUME = 1_000.0


def synthetic_bars(n_bars: int, seed: int) -> Bars:
    """`n_bars` hourly bars, a pure function of (`n_bars`, `seed`)."""
    if n_bars < 2:
        raise ValueError(f"a synthetic market needs at least 2 bars, got {n_bars}")
    rng = np.random.default_rng(seed)
    # Draw every random number up front, in a fixed order, so the stream never depends on
    # branches taken inside the loop.
    shocks = rng.standard_t(_T_DOF, n_bars) * np.sqrt((_T_DOF - 2) / _T_DOF)
    switch = rng.random(n_bars) > _REGIME_STAY
    next_regime = rng.integers(1, len(_REGIMES), n_bars)
    wick_up, wick_down = np.abs(rng.standard_normal((2, n_bars)))
    volume_noise = rng.standard_normal(n_bars)

    regime = np.empty(n_bars, dtype=np.int64)
    sigma = np.empty(n_bars)
    omega = _BASE_VOL**2 * (1 - _GARCH_ALPHA - _GARCH_BETA)
    variance = _BASE_VOL**2
    state = 0
    for t in range(n_bars):
        if switch[t]:
            state = (state + int(next_regime[t])) % len(_REGIMES)
        regime[t] = state
        sigma[t] = np.sqrt(variance)
        shock = sigma[t] * shocks[t]
        variance = omega + _GARCH_ALPHA * shock**2 + _GARCH_BETA * variance

    drift = _REGIMES[regime, 0] / _HOURS_PER_YEAR
    bar_vol = sigma * _REGIMES[regime, 1]
    # Ito's correction keeps the expected price growth at the regime's drift.
    log_returns = drift - 0.5 * bar_vol**2 + bar_vol * shocks
    log_returns[0] = 0.0
    close = _START_PRICE * np.exp(np.cumsum(log_returns))
    open_ = np.concatenate(([_START_PRICE], close[:-1]))
    # Wicks beyond the open-close body, half a bar's volatility on average.
    high = np.maximum(open_, close) * np.exp(0.5 * bar_vol * wick_up)
    low = np.minimum(open_, close) * np.exp(-0.5 * bar_vol * wick_down)
    volume = _BASE_VOLUME * (bar_vol / _BASE_VOL) * np.exp(0.3 * volume_noise)
    return Bars(
        time_ns=_START_NS + _BAR_NS * np.arange(n_bars, dtype=np.int64),
        open=open_,
        high=high,
        low=low,
        close=close,
        volume=volume,
        source=f"synthetic GBM market, seed {seed}, {n_bars} hourly bars",
    )
