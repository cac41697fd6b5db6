"""Interquartile means and stratified-bootstrap 95 % intervals over seeds (Agarwal et al. 2021).

"Deep RL at the edge of the statistical precipice" (NeurIPS 2021): few runs
per configuration call for the interquartile mean, robust to an outlier seed
yet less noisy than the median, and for percentile-bootstrap intervals
drawn within each stratum (a task's runs resampled with replacement, every
task independently). The method is their `rliable` package's, written here
in numpy: rliable itself brings scipy, pandas, statsmodels, arch and seaborn
for a dozen lines of this (docs/federation-benchmark.md, "Statistics").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

REPS = 10_000
"""Bootstrap resamples per interval."""
SEED = 2021
"""The bootstrap's generator seed: the same data give the same interval, in any order."""
CONFIDENCE = 0.95

Gain = Literal["gain", "no measurable gain", "loss"]


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95 % interval."""

    value: float
    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def gain(self) -> Gain:
        """What a speed-up ratio shows: a gain only where its whole interval lies above 1."""
        if self.low > 1.0:
            return "gain"
        if self.high < 1.0:
            return "loss"
        return "no measurable gain"


def iqm(values: npt.ArrayLike) -> float:
    """The interquartile mean: the mean of what is left once the lowest and the highest
    quarter (⌊n/4⌋ values each) are cut, as scipy.stats.trim_mean(x, 0.25) and rliable
    compute it. For fewer than 4 values nothing is cut."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    if flat.size == 0:
        raise ValueError("the interquartile mean of no values")
    return float(_iqm_rows(flat[None, :])[0])


def _iqm_rows(samples: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The IQM of every row of a 2-D array."""
    ordered = np.sort(samples, axis=1)
    cut = ordered.shape[1] // 4
    return np.asarray(ordered[:, cut : ordered.shape[1] - cut].mean(axis=1), dtype=np.float64)


def stratified_resamples(
    scores: npt.ArrayLike, rng: np.random.Generator, reps: int = REPS
) -> npt.NDArray[np.float64]:
    """`reps` bootstrap resamples of `scores` (runs, or runs x tasks): every task's runs drawn
    with replacement from that task's alone. Shape (reps, runs * tasks)."""
    matrix = _matrix(scores)
    runs, tasks = matrix.shape
    rows = rng.integers(0, runs, size=(reps, runs, tasks))
    return matrix[rows, np.arange(tasks)].reshape(reps, runs * tasks)


def iqm_interval(scores: npt.ArrayLike, *, reps: int = REPS, seed: int = SEED) -> Estimate:
    """The IQM of `scores` (runs, or runs x tasks) and its stratified percentile interval."""
    matrix = _matrix(scores)
    rng = np.random.default_rng(seed)
    boot = _iqm_rows(stratified_resamples(matrix, rng, reps))
    return _estimate(iqm(matrix), boot)


def ratio_interval(
    numerator: npt.ArrayLike,
    denominator: npt.ArrayLike,
    *,
    reps: int = REPS,
    seed: int = SEED,
) -> Estimate:
    """IQM(numerator) / IQM(denominator) and its interval: both sides resampled, each within
    its own strata and independently of the other (two arrangements' runs), the ratio taken
    per resample. A speed-up is the reference's steps over the group's."""
    top, bottom = _matrix(numerator), _matrix(denominator)
    if np.any(top < 0) or np.any(bottom <= 0):
        raise ValueError("a ratio of IQMs needs positive values (steps, seconds)")
    rng = np.random.default_rng(seed)
    boot_top = _iqm_rows(stratified_resamples(top, rng, reps))
    boot_bottom = _iqm_rows(stratified_resamples(bottom, rng, reps))
    return _estimate(iqm(top) / iqm(bottom), boot_top / boot_bottom)


def _matrix(scores: npt.ArrayLike) -> npt.NDArray[np.float64]:
    matrix = np.asarray(scores, dtype=np.float64)
    if matrix.ndim == 1:
        matrix = matrix[:, None]
    if matrix.ndim != 2 or matrix.size == 0:
        raise ValueError(f"scores must be runs or runs x tasks and not empty, got {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError("scores must be finite (count an unsolved run at its budget)")
    return matrix


def _estimate(value: float, boot: npt.NDArray[np.float64]) -> Estimate:
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(boot, [tail, 100 - tail])
    return Estimate(value=float(value), low=float(low), high=float(high))


def describe(estimate: Estimate, spec: str = ",.0f") -> str:
    """`value [low, high]`."""
    return f"{estimate.value:{spec}} [{estimate.low:{spec}}, {estimate.high:{spec}}]"


def describe_speedup(estimate: Estimate) -> str:
    """A speed-up as the report prints it: "no measurable gain" where its interval holds 1."""
    said = f"{describe(estimate, '.2f')}x"
    if estimate.gain == "gain":
        return said
    if estimate.gain == "loss":
        return f"{said} slower: a measurable loss"
    return f"{said} no measurable gain"
