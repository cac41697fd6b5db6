"""The session's observation bounds, so that a push never carries a row the server refuses.

The server checks every pushed observation against the Box of the session's
model spec and refuses the whole batch at the first value outside it. Some
environments leave their own declared space: LunarLander-v3 declares its
position within ±2.5 and its speeds within ±10, and a lander that flies off
reports more (measured: y = 6.1 in one run, refusing a batch of 4,096
transitions for that one row). Those rows still train the participant's own
model; they are only kept out of what it shares, and it says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrl.client.training.transitions import LearnerTransitions
from fedrl.proto.v1 import tensor_pb2 as tpb


@dataclass(frozen=True)
class ObservationBounds:
    """low..high per element of one observation, compared as the server compares them."""

    low: np.ndarray
    """float64 [*obs_shape]."""
    high: np.ndarray
    """float64 [*obs_shape]."""

    @classmethod
    def of(cls, space: tpb.SpaceSpec) -> ObservationBounds | None:
        """The spec's bounds; None where it gives none (images: their dtype's range)."""
        if not space.low and not space.high:
            return None
        shape = tuple(space.shape)
        return cls(
            low=np.asarray(space.low, dtype=np.float64).reshape(shape),
            high=np.asarray(space.high, dtype=np.float64).reshape(shape),
        )

    def inside(self, batch: LearnerTransitions) -> np.ndarray:
        """bool [B]: rows whose obs and next_obs lie within the bounds in every element.

        float32 values are widened to float64 against float64 bounds, as the
        server does, so a row kept here is a row the server accepts.
        """
        axes = tuple(range(1, batch.obs.ndim))
        keep = np.ones(len(batch), dtype=np.bool_)
        for column in (batch.obs, batch.next_obs):
            outside = np.less(column, self.low) | np.greater(column, self.high)
            keep &= ~outside.any(axis=axes)
        return keep
