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

The versions a participant adopts join at most one every
`snapshot_interval` updates, as its snapshots do. In rounds a group makes a
version every 128 env steps: each joining would fill the pool with near
copies of the latest policy (64 versions are a few thousand env steps of
play), add thousands of entries to the ratings every participant reports,
and rewrite the actors' board every round. Versions pulled by number at
join are the session's history and always join.
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
        self._version_at: int | None = None
        """Learner updates when the last adopted version joined (None: none yet)."""

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

    def add_version(
        self, version: int, weights: NamedArrays, *, adopted_at: int | None = None
    ) -> None:
        """A global version joins the league (once), and the board is fielded anew.

        One adopted when the learner had made `adopted_at` updates joins only
        if no adopted version joined in the last `snapshot_interval` updates
        (module docstring).
        """
        if adopted_at is not None:
            if self._version_at is not None and (
                adopted_at - self._version_at < self.config.snapshot_interval
            ):
                return
            self._version_at = adopted_at
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
