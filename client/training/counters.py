"""What the training engine counts: where training stands, what one round did, and the tally.

`Counters` is what autosave persists and resume restores, `PollResult` what
one engine round reports, and `Tally` the running counts both are made of.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from fedrl.client.training.evaluation import EvalResult
from fedrl.envs.two_player import NO_OPPONENT

if TYPE_CHECKING:
    from fedrl.client.training.distributed import RoundLedger, RoundOutcome


@dataclass(frozen=True)
class Counters:
    """Where training stands; what autosave persists and what resume restores."""

    episodes: int = 0
    env_steps: int = 0
    updates: int = 0
    best_eval: float | None = None
    last_eval: float | None = None
    recent_returns: tuple[float, ...] = ()


@dataclass(frozen=True)
class PollResult:
    """What one round did."""

    episode_returns: tuple[float, ...]
    episode_lengths: tuple[int, ...]
    env_steps: int
    updates: int
    train_metrics: dict[str, float]
    evaluation: EvalResult | None
    new_best: bool
    policy_updates: int = 0
    """PPO: rollouts learned from in this round (the sync loop pushes after each); DQN: 0."""
    rating: float | None = None
    """Two-player games: the learner's Elo after this round (fedrl.client.training.league)."""


class Tally:
    """Env steps, episodes and returns counted so far, and foreign transitions' replay credit.

    As one learner rank of several (with a `ledger`), what this rank collects
    waits in the ledger until the ranks' exchange, whose outcome `settle` then
    adds on every rank alike: a round cut short by a dead rank leaves
    counters and metrics agreeing.
    """

    def __init__(self, *, recent_window: int, ledger: RoundLedger | None = None) -> None:
        self.ledger = ledger
        self.episodes = 0
        self.env_steps = 0
        self.foreign_credit = 0.0
        """Local-step equivalents of the foreign transitions taken in (replay-ratio credit)."""
        self.recent: collections.deque[float] = collections.deque(maxlen=recent_window)
        self._finished: list[tuple[float, int]] = []
        self._games: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]] = []

    def count(
        self,
        env_steps: int,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
        opponents: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """What actors collected: held for the next exchange as a rank, counted at once alone.

        `opponents`: two-player games' opponent id of each episode, whose
        outcomes `take_games` hands to the league.
        """
        if opponents is not None:
            played = opponents != NO_OPPONENT
            if played.any():
                if self.ledger is not None:
                    raise RuntimeError("two-player games train with one learner rank")
                self._games.append((opponents[played], episode_returns[played]))
        if self.ledger is not None:
            self.ledger.hold(env_steps, episode_returns, episode_lengths)
        else:
            self._add(env_steps, episode_returns, episode_lengths)

    def credit_foreign(self, credit: float) -> None:
        """Replay-ratio credit of foreign transitions taken in.

        As a rank, the credit joins the others' at the next exchange: every
        rank must owe the same updates, each being a collective.
        """
        if self.ledger is not None:
            self.ledger.hold_foreign(credit)
        else:
            self.foreign_credit += credit

    def settle(self, outcome: RoundOutcome) -> None:
        """Add every rank's counts of one exchange."""
        self._add(outcome.env_steps, outcome.episode_returns, outcome.episode_lengths)
        self.foreign_credit += outcome.foreign_credit

    def take_finished(self) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """Returns and lengths of the episodes counted since the last call."""
        finished, self._finished = self._finished, []
        return tuple(r for r, _ in finished), tuple(n for _, n in finished)

    def take_games(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Opponent ids and outcomes of the games counted since the last call."""
        games, self._games = self._games, []
        if not games:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return np.concatenate([o for o, _ in games]), np.concatenate([r for _, r in games])

    def restore(self, counters: Counters) -> None:
        """Continue from saved counters (resume)."""
        self.episodes = counters.episodes
        self.env_steps = counters.env_steps
        self.recent.clear()
        self.recent.extend(counters.recent_returns)

    def _add(
        self,
        env_steps: int,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
    ) -> None:
        self.env_steps += env_steps
        self.episodes += len(episode_returns)
        self.recent.extend(float(r) for r in episode_returns)
        self._finished.extend(
            (float(r), int(n)) for r, n in zip(episode_returns, episode_lengths, strict=True)
        )
