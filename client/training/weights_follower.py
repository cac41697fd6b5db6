"""WeightsFollower: the part every actor core shares, taking the learner's published weights."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt
from torch import nn

from fedrl.client.training.q_network import load_named_arrays

Net = TypeVar("Net", bound=nn.Module)


class WeightsFollower(Generic[Net]):
    """An actor core's own copy of the learner's network, and which published version it holds.

    `weights_version` starts at -1, below every published version, so the
    actor loop (which copies whenever the board's version differs) takes the
    first weights it sees.
    """

    _net: Net
    weights_version: int = -1

    def load_weights(
        self, arrays: Sequence[tuple[str, npt.NDArray[np.generic]]], version: int
    ) -> None:
        load_named_arrays(self._net, list(arrays))
        self.weights_version = version
