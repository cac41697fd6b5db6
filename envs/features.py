"""Causal, normalised per-bar features, computed once per dataset so stepping is only indexing.

Row t uses bars 0..t and nothing later: rolling statistics come from running sums, averages
from recursive filters, and every normalisation is trailing (a z-score over the whole file
would leak the future's mean into the past). Every feature is scale-free, so one network
reads any asset at any price level, and clipped to +-FEATURE_CLIP.

Indicator columns (RSI, moving averages, anything the data holds) follow the base features,
one each: a missing value takes the last known one (never a later one), and each becomes a
trailing z-score over INDICATOR_WINDOW bars, since their scales are unknown in advance.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fedrl.envs.bars import Bars

FEATURE_NAMES = (
    "log_return",  # this bar's log return over its trailing volatility
    "volatility",  # log of short over long trailing volatility: is the market unusually wild?
    "rsi",  # Wilder's 14-bar RSI, mapped from [0, 100] to [-1, 1]
    "macd",  # MACD (12/26 EMAs of close) over price times trailing volatility
    "macd_histogram",  # MACD minus its 9-bar signal line, same units
    "volume_z",  # z-score of log volume over the trailing 20 bars
)
FEATURE_CLIP = 5.0
"""Bound of every feature: a 5-sigma day is news, not a reason to saturate the network."""
# Standard technical-analysis periods (Wilder 1978; Appel's MACD).
_RSI_PERIOD = 14
_MACD_FAST, _MACD_SLOW, _MACD_SIGNAL = 12, 26, 9
_SHORT_VOL_WINDOW = 20
_VOLUME_WINDOW = 20
INDICATOR_WINDOW = 256
"""Bars of an indicator's trailing z-score: the long volatility's window, for the same reason."""
# Long enough for a stable scale, short enough to follow regime changes.
_LONG_VOL_WINDOW = 256
# Rows before this have incomplete windows (the long volatility, plus three slow-EMA spans for
# the MACD to forget its start); they are zeros and no observation reaches back to them.
WARMUP = _LONG_VOL_WINDOW + 3 * _MACD_SLOW
# Floors that keep ratios finite on flat stretches (a stable coin, a halted market).
_TINY_VOL = 1e-8
_TINY_STD = 1e-6

FloatArray = npt.NDArray[np.float64]


def feature_names(indicators: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The columns of compute_features: the base features, then one per indicator."""
    return FEATURE_NAMES + tuple(f"indicator:{name}" for name in indicators)


def compute_features(bars: Bars) -> npt.NDArray[np.float32]:
    """(len(bars), len(feature_names(indicators))) float32, read-only; rows before WARMUP
    are zero."""
    close = bars.close
    log_return = np.zeros(len(close))
    log_return[1:] = np.diff(np.log(close))
    long_vol = np.maximum(np.sqrt(_trailing_mean(log_return**2, _LONG_VOL_WINDOW)), _TINY_VOL)
    short_vol = np.maximum(np.sqrt(_trailing_mean(log_return**2, _SHORT_VOL_WINDOW)), _TINY_VOL)

    gains = np.maximum(np.diff(close, prepend=close[0]), 0.0)
    losses = np.maximum(-np.diff(close, prepend=close[0]), 0.0)
    # Wilder's smoothing is an EMA with alpha = 1/period.
    avg_gain = _ema(gains, 1 / _RSI_PERIOD)
    avg_loss = _ema(losses, 1 / _RSI_PERIOD)
    total = avg_gain + avg_loss
    rsi = np.divide(avg_gain, total, out=np.full_like(total, 0.5), where=total > 0)

    macd = _ema(close, 2 / (_MACD_FAST + 1)) - _ema(close, 2 / (_MACD_SLOW + 1))
    signal = _ema(macd, 2 / (_MACD_SIGNAL + 1))
    price_vol = close * long_vol

    # Centred on the first bar (a causal constant) so that E[x^2] - E[x]^2 does not cancel.
    log_volume = np.log1p(bars.volume)
    centred = log_volume - log_volume[0]
    volume_mean = _trailing_mean(centred, _VOLUME_WINDOW)
    volume_var = np.maximum(_trailing_mean(centred**2, _VOLUME_WINDOW) - volume_mean**2, 0.0)
    volume_z = (centred - volume_mean) / np.maximum(np.sqrt(volume_var), _TINY_STD)

    features = np.stack(
        [
            log_return / long_vol,
            np.log(short_vol / long_vol),
            2 * rsi - 1,
            macd / price_vol,
            (macd - signal) / price_vol,
            volume_z,
            *(_indicator_feature(column) for column in bars.indicators.values()),
        ],
        axis=1,
    )
    features[:WARMUP] = 0.0
    out: npt.NDArray[np.float32] = np.clip(features, -FEATURE_CLIP, FEATURE_CLIP).astype(np.float32)
    out.setflags(write=False)
    return out


def _indicator_feature(values: FloatArray) -> FloatArray:
    """Trailing z-score of an indicator whose missing values take the last known one; 0 until
    the first known value."""
    known = ~np.isnan(values)
    if not known.any():
        return np.zeros(len(values))
    last = np.maximum.accumulate(np.where(known, np.arange(len(values)), -1))
    filled = np.where(last >= 0, values[np.maximum(last, 0)], 0.0)
    centred = filled - filled[np.argmax(known)]
    mean = _trailing_mean(centred, INDICATOR_WINDOW)
    var = np.maximum(_trailing_mean(centred**2, INDICATOR_WINDOW) - mean**2, 0.0)
    z = (centred - mean) / np.maximum(np.sqrt(var), _TINY_STD)
    return np.where(last >= 0, z, 0.0)


def _trailing_mean(values: FloatArray, window: int) -> FloatArray:
    """Mean of values[t - window + 1 .. t] (fewer at the start), from a running sum.

    The running sum starts from values[0] subtracted, a causal offset that keeps the sum
    small: its rounding then cannot swamp the window's differences on long files.
    """
    sums = np.cumsum(values - values[0])
    lagged = np.zeros_like(sums)
    lagged[window:] = sums[:-window]
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    means: FloatArray = (sums - lagged) / counts + values[0]
    return means


def _ema(values: FloatArray, alpha: float) -> FloatArray:
    """Exponential moving average seeded with the first value; a loop, because it is recursive.

    Python floats over a list run at ~10 M steps/s, a fraction of a second for a million bars
    once per dataset.
    """
    smoothed: list[float] = []
    level = float(values[0])
    for value in values.tolist():
        level += alpha * (value - level)
        smoothed.append(level)
    return np.array(smoothed)
