"""Evaluation of a two-player game's policy: greedy games against the fixed players, both seats.

The counterpart of fedrl.client.training.evaluation.Evaluator for
`pettingzoo/...` envs, with the same `run_policy`: the policy plays
`episodes` games against each fixed player (random, lookahead) in each seat
(first and second), all at once on envs of its own, greedily; the result
holds every game's outcome (+1, 0, −1) as its returns, and the win, draw
and loss counts of each pairing as its matches. Each evaluation reseeds the
games from its own child of the seed stream, so successive evaluations
face different random moves.
"""

from __future__ import annotations

import time

import numpy as np

from fedrl.client.training.evaluation import Act, EvalResult, MatchRecord
from fedrl.client.training.vector_env import as_observations
from fedrl.envs.board_games import BASELINES, game_rules
from fedrl.envs.two_player import Baseline, TwoPlayerVectorEnv


class GameEvaluator:
    """Greedy games against every fixed player from both seats, on envs no actor touches."""

    def __init__(self, env_id: str, *, episodes: int, seed: np.random.SeedSequence) -> None:
        """`episodes`: games per fixed player and seat."""
        if episodes < 1:
            raise ValueError(f"evaluation needs at least one game, got {episodes}")
        rules = game_rules(env_id)
        seats = [0] * episodes + [1] * episodes
        self._envs = {
            name: TwoPlayerVectorEnv(
                env_id, 2 * episodes, opponents=Baseline(rules, name), seats=seats
            )
            for name in BASELINES
        }
        self._episodes = episodes
        self._seed = seed

    def run_policy(self, act: Act) -> EvalResult:
        """Plays every env's first game to its end; the outcomes and each pairing's record."""
        start = time.perf_counter()
        returns: list[float] = []
        matches: list[MatchRecord] = []
        for (name, env), seeds in zip(
            self._envs.items(), self._seed.spawn(len(self._envs)), strict=True
        ):
            outcome = _play(env, act, int(seeds.generate_state(1)[0]))
            returns += outcome.tolist()
            for seat in (0, 1):
                games = outcome[seat * self._episodes : (seat + 1) * self._episodes]
                matches.append(
                    MatchRecord(
                        opponent=name,
                        seat=seat,
                        wins=int((games > 0).sum()),
                        draws=int((games == 0).sum()),
                        losses=int((games < 0).sum()),
                    )
                )
        return EvalResult(
            returns=tuple(returns),
            seconds=time.perf_counter() - start,
            matches=tuple(matches),
        )

    def close(self) -> None:
        for env in self._envs.values():
            env.close()


def _play(env: TwoPlayerVectorEnv, act: Act, seed: int) -> np.ndarray:
    """Each env's first game, played out; its outcome per env."""
    obs, _ = env.reset(seed=seed)
    outcome = np.zeros(env.num_envs, dtype=np.float64)
    running = np.ones(env.num_envs, dtype=np.bool_)
    # A game ends within its board's cells of moves, half of them the policy's.
    for _ in range(env.rules.cells):
        obs, reward, terminated, _, _ = env.step(act(as_observations(obs)))
        outcome += np.where(running, reward, 0.0)
        running &= ~np.asarray(terminated)
        if not running.any():
            return outcome
    raise RuntimeError("a game went on past its board's size")
