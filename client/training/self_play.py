"""Self-play in the engine: a two-player game's league, and the board its actors draw from.

The training engine (fedrl.client.training.engine) holds one `SelfPlay` for
a `pettingzoo/...` env. At start it makes the board
(fedrl.client.training.opponent_board) that every actor's spec names; after
each round it hands the finished games to the league (ratings, PFSP
scores), takes a snapshot of the learner's policy every
`snapshot_interval` updates, and then fields the league's opponents on the
board again, as it does for every global version that joins
(`add_version`). The board keeps its size: actors never hold more networks
than its slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from fedrl.client.training.league import League, NamedArrays, Rating
from fedrl.client.training.opponent_board import board_layout, publish
from fedrl.client.training.opponent_pool import OpponentsSpec
from fedrl.client.training.self_play_config import SelfPlayConfig
from fedrl.client.training.shm import WeightsBoard


class SelfPlay:
    """A league and its board, kept in step with the learner's updates."""

    def __init__(self, config: SelfPlayConfig, *, seed: int) -> None:
        self.config = config
        self.league = League(config, seed=seed)
        self._board: WeightsBoard | None = None
        self._snapshot_at = 0

    def start(self, weights: NamedArrays) -> OpponentsSpec:
        """The board, holding what the league fields now, for the actors' specs."""
        if self._board is not None:
            raise RuntimeError("self-play already started")
        self._board = WeightsBoard(board_layout(weights, self.config.opponent_slots))
        self._field()
        return OpponentsSpec(
            board_name=self._board.name,
            board_layout=self._board.layout,
            epsilon=self.config.opponent_epsilon,
        )

    def after_poll(
        self,
        opponents: npt.NDArray[np.int64],
        outcomes: npt.NDArray[np.float64],
        *,
        updates: int,
        weights: Callable[[], NamedArrays],
    ) -> None:
        """Record the round's games; snapshot the learner (and field anew) when one is due."""
        self.league.record(opponents, outcomes)
        if updates - self._snapshot_at >= self.config.snapshot_interval:
            self._snapshot_at = updates - updates % self.config.snapshot_interval
            self.league.add_snapshot(weights(), updates=updates)
            self._field()

    def add_version(self, version: int, weights: NamedArrays) -> None:
        """A global version joins the league (once), and the board is fielded anew."""
        if self.league.add_version(version, weights) is not None:
            self._field()

    def ratings(self) -> list[Rating]:
        return self.league.ratings()

    def state_dict(self) -> dict[str, Any]:
        return self.league.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The saved league; snapshots go on from the last one it holds."""
        self.league.load_state_dict(state)
        taken = [e.updates for e in self.league.entries.values() if e.kind == "snapshot"]
        self._snapshot_at = max(taken, default=0)
        self._field()

    def close(self) -> None:
        if self._board is not None:
            self._board.close()
            self._board = None

    def _field(self) -> None:
        if self._board is not None:
            publish(self._board, self.league.fielded())
