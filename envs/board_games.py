"""Two-player board games by id (`pettingzoo/connect_four_v3`), their rules and fixed players.

PettingZoo's classic AEC envs play the games (fedrl.envs.two_player wraps
them); what lives here is what a player needs to know about a board without
stepping an env: which cell a move fills and which lines win. The fixed
baselines of self-play are written with it, batched over envs:

- `random_player`: a uniformly random legal move;
- `lookahead_player`: a move that wins at once if there is one, else one that
  takes the cell where the opponent would win next (block), else a random
  legal move.

An observation, for every player, is the env's own from that player's
perspective, flattened: the board's two planes (own pieces, the opponent's),
[rows, cols, 2] in PettingZoo's order, then the legal-action mask
(1 legal, 0 not). The networks read the mask from its end
(fedrl.client.training.masking).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

PETTINGZOO_PREFIX = "pettingzoo/"
INSTALL_HINT = "two-player games need PettingZoo: pip install 'fedrl[games]'"

Player = Callable[
    [npt.NDArray[np.float32], npt.NDArray[np.bool_], np.random.Generator], npt.NDArray[np.int64]
]
"""Observations [B, D] and legal actions [B, A] (and a generator) to one legal action each."""


@dataclass(frozen=True)
class GameRules:
    """A board of rows × cols cells and the lines of `connect` cells that win."""

    name: str
    """PettingZoo's id of the game, e.g. connect_four_v3."""
    rows: int
    cols: int
    connect: int
    gravity: bool
    """Moves name a column and the piece falls to its lowest empty cell (connect four);
    without gravity a move names its cell, row-major (tic-tac-toe)."""

    @property
    def cells(self) -> int:
        return self.rows * self.cols

    @property
    def actions(self) -> int:
        return self.cols if self.gravity else self.cells

    @property
    def obs_size(self) -> int:
        """Two planes of cells and the mask."""
        return 2 * self.cells + self.actions

    @cached_property
    def lines(self) -> npt.NDArray[np.int64]:
        """Every winning line as `connect` row-major cell indices, [lines, connect]."""
        found = []
        steps = ((0, 1), (1, 0), (1, 1), (1, -1))
        for r in range(self.rows):
            for c in range(self.cols):
                for dr, dc in steps:
                    cells = [(r + k * dr, c + k * dc) for k in range(self.connect)]
                    if all(0 <= rr < self.rows and 0 <= cc < self.cols for rr, cc in cells):
                        found.append([rr * self.cols + cc for rr, cc in cells])
        return np.asarray(found, dtype=np.int64)

    def split(
        self, obs: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """Own pieces [B, cells], the opponent's [B, cells] and legal actions [B, A]."""
        if obs.ndim != 2 or obs.shape[1] != self.obs_size:
            raise ValueError(
                f"{self.name} observations are [batch, {self.obs_size}], got {obs.shape}"
            )
        planes = obs[:, : 2 * self.cells].reshape(-1, self.cells, 2) > 0.5
        return planes[:, :, 0], planes[:, :, 1], obs[:, 2 * self.cells :] > 0.5

    def target_cells(self, occupied: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
        """The cell each action would fill, [B, A]; -1 where it fills none (a full column)."""
        if not self.gravity:
            cells = np.broadcast_to(np.arange(self.cells), occupied.shape).copy()
            cells[occupied] = -1
            return cells
        empty = ~occupied.reshape(-1, self.rows, self.cols)
        # The lowest empty row of each column: the last True from the top.
        lowest = self.rows - 1 - np.argmax(empty[:, ::-1, :], axis=1)
        cells = lowest * self.cols + np.arange(self.cols)
        return np.where(np.any(empty, axis=1), cells, -1).astype(np.int64)

    def winning_actions(
        self, pieces: npt.NDArray[np.bool_], target: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """Whether adding a piece at each action's target cell completes a line of `pieces`,
        [B, A]; `target` from `target_cells`."""
        actions = target.shape[1]
        boards = np.repeat(pieces[:, None, :], actions, axis=1)
        b, a = np.nonzero(target >= 0)
        boards[b, a, target[b, a]] = True
        lines = boards[:, :, self.lines]  # [B, A, lines, connect]
        wins: npt.NDArray[np.bool_] = np.all(lines, axis=3).any(axis=2) & (target >= 0)
        return wins

    @cached_property
    def symmetries(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The board's symmetries, the identity first, as (features [S, obs_size], actions
        [S, A]): feature i of a transformed observation is feature `features[s, i]` of the
        original, and action a becomes `actions[s, a]`.

        A winning line maps onto a winning line under each of them, and the
        legal moves onto the legal moves, so a transition's value is the same
        in every one: gravity leaves the left-right mirror (connect four); a
        square board without it has the eight rotations and reflections
        (tic-tac-toe).
        """
        grid = np.arange(self.cells).reshape(self.rows, self.cols)
        if self.gravity or self.rows != self.cols:
            boards = [grid, grid[:, ::-1]]
        else:
            boards = [np.rot90(g, k) for g in (grid, grid.T) for k in range(4)]
        features, actions = [], []
        for board in boards:
            source = board.reshape(-1)  # cell i of the transformed board is cell source[i]
            moves = source[: self.cols] if self.gravity else source
            planes = np.stack([2 * source, 2 * source + 1], axis=1).reshape(-1)
            features.append(np.concatenate([planes, 2 * self.cells + moves]))
            image = np.empty(self.actions, dtype=np.int64)
            image[moves] = np.arange(self.actions)
            actions.append(image)
        return np.asarray(features, dtype=np.int64), np.asarray(actions, dtype=np.int64)


GAMES: dict[str, GameRules] = {
    rules.name: rules
    for rules in (
        GameRules(name="connect_four_v3", rows=6, cols=7, connect=4, gravity=True),
        GameRules(name="tictactoe_v3", rows=3, cols=3, connect=3, gravity=False),
    )
}
"""The games fedrl plays, by PettingZoo id."""


def is_two_player(env_id: str) -> bool:
    """Whether `env_id` names a two-player game (`pettingzoo/<game>`)."""
    return env_id.startswith(PETTINGZOO_PREFIX)


def game_rules(env_id: str) -> GameRules:
    """The rules of `pettingzoo/<game>`; ValueError naming the games there are."""
    name = env_id.removeprefix(PETTINGZOO_PREFIX)
    if not is_two_player(env_id) or name not in GAMES:
        known = ", ".join(PETTINGZOO_PREFIX + game for game in GAMES)
        raise ValueError(f"unknown two-player game {env_id!r}; fedrl plays {known}")
    return GAMES[name]


def random_legal(legal: npt.NDArray[np.bool_], rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """One uniformly random legal action per row of `legal` [B, A] (each row has one)."""
    if not legal.any(axis=1).all():
        raise ValueError("a row of the action mask has no legal action")
    # The largest of uniform draws over the legal actions is uniform among them.
    draws = rng.random(legal.shape) + legal
    chosen: npt.NDArray[np.int64] = np.argmax(draws, axis=1).astype(np.int64)
    return chosen


def random_player(rules: GameRules) -> Player:
    """Plays a uniformly random legal move."""

    def act(
        obs: npt.NDArray[np.float32], legal: npt.NDArray[np.bool_], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        return random_legal(legal, rng)

    return act


def lookahead_player(rules: GameRules) -> Player:
    """Wins at once where it can, blocks the opponent's immediate win where it must, else
    plays a random legal move (ties among wins or blocks are broken at random too)."""

    def act(
        obs: npt.NDArray[np.float32], legal: npt.NDArray[np.bool_], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        own, other, mask = rules.split(obs)
        legal = legal & mask
        target = rules.target_cells(own | other)
        wins = rules.winning_actions(own, target) & legal
        blocks = rules.winning_actions(other, target) & legal
        choice = np.where(
            wins.any(axis=1, keepdims=True),
            wins,
            np.where(blocks.any(axis=1, keepdims=True), blocks, legal),
        )
        return random_legal(choice, rng)

    return act


BASELINES: dict[str, Callable[[GameRules], Player]] = {
    "random": random_player,
    "lookahead": lookahead_player,
}
"""The fixed players every game has, by the name ratings and evaluations give them."""
