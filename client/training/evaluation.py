"""Greedy evaluation on env instances of its own."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from fedrl.client.training.policy_network import ActorCritic
from fedrl.client.training.q_network import load_named_arrays
from fedrl.client.training.vector_env import as_observations, make_vector_env, reset_seeded

QValues = Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]
Act = Callable[[npt.NDArray[np.float32]], npt.NDArray[np.generic]]
"""Observations [B, *obs_shape] to one greedy action each: ints [B], or floats [B, d] for Box."""


@dataclass(frozen=True)
class MatchRecord:
    """Two-player games: how the evaluated policy fared against one fixed player in one seat."""

    opponent: str
    """"random" or "lookahead"."""
    seat: int
    """0: the policy moved first; 1: second."""
    wins: int
    draws: int
    losses: int

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    def rates(self) -> tuple[float, float, float]:
        """Win, draw and loss rates."""
        games = max(1, self.games)
        return self.wins / games, self.draws / games, self.losses / games

    @property
    def label(self) -> str:
        """ "random first", "lookahead second", ..."""
        return f"{self.opponent} {('first', 'second')[self.seat]}"

    def fields(self) -> dict[str, float]:
        """The rates as flat record fields, e.g. random_first_win."""
        stem = self.label.replace(" ", "_")
        win, draw, loss = self.rates()
        return {f"{stem}_win": win, f"{stem}_draw": draw, f"{stem}_loss": loss}


@dataclass(frozen=True)
class EvalResult:
    """Undiscounted returns of the evaluation episodes, one per env."""

    returns: tuple[float, ...]
    """Undiscounted return of each evaluation episode."""
    seconds: float
    """Wall time the evaluation took, so that callers can report training time without it."""
    matches: tuple[MatchRecord, ...] = ()
    """Two-player games: the record against each fixed player in each seat (the returns are
    those games' outcomes, +1, 0 or −1)."""

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


class PolicyEvaluator(Protocol):
    """What scores a policy: an Evaluator, or a two-player game's GameEvaluator."""

    def run_policy(self, act: Act) -> EvalResult: ...

    def close(self) -> None: ...


class Evaluator:
    """Runs `episodes` greedy episodes at once, one per env, on envs no actor touches.

    The envs are kept between evaluations (making a vector env costs more than
    a CartPole evaluation), and each evaluation reseeds them from its own
    child of the seed stream, so successive evaluations see different starts.
    """

    def __init__(
        self,
        env_id: str,
        *,
        episodes: int,
        seed: np.random.SeedSequence,
        max_steps: int,
        data: str | None = None,
        window: int = 0,
    ) -> None:
        """`window` > 0: observations are windows of the last `window` ones (the transformer)."""
        if episodes < 1:
            raise ValueError(f"evaluation needs at least one episode, got {episodes}")
        self._env = make_vector_env(env_id, episodes, data, window=window)
        self._seed = seed
        self._max_steps = max_steps

    def run(self, q_values: QValues) -> EvalResult:
        """Greedy on Q-values: the action with the largest one."""
        return self.run_policy(lambda obs: np.argmax(q_values(obs), axis=1))

    def run_policy(self, act: Act) -> EvalResult:
        """Plays until every env has ended its first episode; after `max_steps`, partial returns."""
        start = time.perf_counter()
        (seeds,) = self._seed.spawn(1)
        obs = reset_seeded(self._env, seeds)
        n = len(obs)
        total = np.zeros(n, dtype=np.float64)
        running = np.ones(n, dtype=np.bool_)
        for _ in range(self._max_steps):
            action = act(obs)
            next_obs, reward, terminated, truncated, _ = self._env.step(action)
            total += np.where(running, reward, 0.0)
            running &= ~(np.asarray(terminated) | np.asarray(truncated))
            if not running.any():
                break
            obs = as_observations(next_obs)
        return EvalResult(
            returns=tuple(float(r) for r in total), seconds=time.perf_counter() - start
        )

    def close(self) -> None:
        self._env.close()


def greedy_policy(net: nn.Module) -> Act:
    """The greedy action of a Q-network (argmax) or an actor-critic (its `greedy`) per row."""
    device = next(net.parameters()).device

    def act(obs: npt.NDArray[np.float32]) -> npt.NDArray[np.generic]:
        with torch.inference_mode():
            batch = torch.from_numpy(obs).to(device)
            if isinstance(net, ActorCritic):
                action: npt.NDArray[np.generic] = net.greedy(batch).cpu().numpy()
            else:
                action = net(batch).argmax(dim=1).cpu().numpy()
        return action

    return act


class Scorer:
    """Scores weights greedily with a network and envs of its own; one caller at a time."""

    def __init__(self, net: nn.Module, evaluator: PolicyEvaluator) -> None:
        self._net = net.requires_grad_(False)
        self._evaluator = evaluator
        self._act = greedy_policy(self._net)

    def score(self, weights: Sequence[tuple[str, npt.NDArray[Any]]]) -> EvalResult:
        load_named_arrays(self._net, weights)
        return self._evaluator.run_policy(self._act)

    def close(self) -> None:
        self._evaluator.close()
