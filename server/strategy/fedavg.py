"""FedAvg's reduction: the weighted mean of the buffered deltas (McMahan et al., 2017)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedrl.server.strategy.aggregate import weighted_mean
from fedrl.server.strategy.strategy import Strategy


class FedAvg(Strategy):
    """sum_i w_i * delta_i / sum_i w_i, weights normalised over the buffer."""

    name = "mean"

    def aggregate(
        self, deltas: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
    ) -> list[np.ndarray]:
        """Weighted mean of the deltas, coordinate by coordinate."""
        return weighted_mean(deltas, weights)
