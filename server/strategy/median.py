"""Coordinate-wise median (Yin et al., 2018): each update counts once, whatever it claims."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedrl.server.strategy.aggregate import median
from fedrl.server.strategy.strategy import Strategy


class Median(Strategy):
    """The median of each coordinate's values; weights are checked, then ignored.

    Weighting the median would let the participant claiming the most samples
    pull every coordinate toward its own values, which is what a robust
    aggregator is there to prevent. With an even count the median is the
    mean of the two middle values.
    """

    name = "median"

    def aggregate(
        self, deltas: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
    ) -> list[np.ndarray]:
        """Median of each coordinate's values across the updates."""
        return median(deltas, weights)
