"""Coordinate-wise trimmed mean (Yin et al., 2018): outliers cut by count, the rest weighted."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedrl.server.strategy.aggregate import check_trim_fraction, trimmed_mean
from fedrl.server.strategy.strategy import Rule, Strategy


class TrimmedMean(Strategy):
    """Per coordinate, floor(trim_fraction * K) values cut at each end, the rest averaged.

    An outlier is cut however much weight it claims; the values left are
    averaged with their updates' weights, so samples and staleness still
    count among the credible ones.
    """

    name = "trimmed_mean"
    options = ("trim_fraction",)

    def __init__(self, rule: Rule | None = None, *, trim_fraction: float = 0.2) -> None:
        """Refuse a fraction that would trim every value."""
        super().__init__(rule)
        check_trim_fraction(trim_fraction)
        self.trim_fraction = trim_fraction
        """Share of the updates cut at each end, per coordinate; in [0, 0.5)."""

    def aggregate(
        self, deltas: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
    ) -> list[np.ndarray]:
        """Weighted mean of each coordinate's values after cutting both tails."""
        return trimmed_mean(deltas, weights, trim_fraction=self.trim_fraction)
