"""An actor's opponents: drawn per game from the league's board, played on this process's CPU.

`OpponentPool` is the `Opponents` of an actor's two-player vector env
(fedrl.envs.two_player): for every new game it draws an opponent by the
odds on the board (fedrl.client.training.opponent_board) and answers the
opponents' moves in batches. The fixed players are numpy
(fedrl.envs.board_games), the latest policy is the actor's own network (the
weights the learner last published to it), and every other opponent is a
network the board holds, copied into a CPU network of this process.
Network opponents play greedily with a small share of random legal moves.

Memory stays bounded whatever the league's size: the pool keeps a network
for each of the board's slots and for each opponent still playing a game
in one of its envs (a game outlives the board it was drawn from), at most
slots + envs networks, reusing modules as the board changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from fedrl.client.training.evaluation import greedy_policy
from fedrl.client.training.exploration import epsilon_greedy
from fedrl.client.training.opponent_board import BoardView, read
from fedrl.client.training.q_network import load_named_arrays
from fedrl.client.training.shm import BoardLayout, WeightsBoard
from fedrl.envs.board_games import BASELINES, GameRules, Player
from fedrl.envs.two_player import BASELINE_IDS, LATEST, NO_OPPONENT, TwoPlayerVectorEnv


@dataclass(frozen=True)
class OpponentsSpec:
    """Where an actor finds its opponents (it crosses the spawn boundary in the actor's spec)."""

    board_name: str
    board_layout: BoardLayout
    epsilon: float
    """Share of random legal moves of network opponents."""


class OpponentPool:
    """The `Opponents` of one actor's env batch, read from the league's board."""

    def __init__(
        self,
        spec: OpponentsSpec,
        rules: GameRules,
        *,
        latest: nn.Module,
        make_net: Callable[[], nn.Module],
        playing: Callable[[], npt.NDArray[np.int64]],
    ) -> None:
        """`latest`: the actor's own network; `make_net`: a fresh network of the same kind, for
        an opponent of the board; `playing`: the opponent ids of the games under way."""
        self._board = WeightsBoard(spec.board_layout, name=spec.board_name)
        self._epsilon = np.array([spec.epsilon])
        self._rules = rules
        self._latest = greedy_policy(latest)
        self._make_net = make_net
        self._playing = playing
        self._baselines: dict[int, Player] = {
            BASELINE_IDS[name]: make(rules) for name, make in BASELINES.items()
        }
        self._nets: dict[int, nn.Module] = {}
        self._view: BoardView | None = None

    @property
    def networks(self) -> int:
        """Opponent networks held now (the bound the module docstring gives)."""
        return len(self._nets)

    def draw(self, rng: np.random.Generator) -> int:
        """An opponent for a new game, by the board's odds (its newest version)."""
        if self._view is None or self._board.version != self._view.version:
            self._refresh()
        assert self._view is not None
        odds = self._view.odds
        total = odds.sum()
        if not total > 0:
            return LATEST
        return int(rng.choice(self._view.ids, p=odds / total))

    def act(
        self,
        opponent: int,
        obs: npt.NDArray[np.float32],
        legal: npt.NDArray[np.bool_],
        rng: np.random.Generator,
    ) -> npt.NDArray[np.int64]:
        """Moves of `opponent` on observations from its side of the board."""
        baseline = self._baselines.get(opponent)
        if baseline is not None:
            return baseline(obs, legal, rng)
        if opponent == LATEST:
            greedy = self._latest(obs)
        elif opponent in self._nets:
            greedy = greedy_policy(self._nets[opponent])(obs)
        else:
            raise RuntimeError(f"opponent {opponent} is neither on the board nor in a game")
        eps = np.broadcast_to(self._epsilon, len(obs))
        return epsilon_greedy(
            np.asarray(greedy, dtype=np.int64), eps, self._rules.actions, rng, legal
        )

    def close(self) -> None:
        self._board.close()

    def _refresh(self) -> None:
        """Take the board's newest version: its networks in, those no game plays any more out."""
        view = read(self._board)
        playing = set(int(i) for i in self._playing()) - {NO_OPPONENT}
        keep = set(view.networks) | playing
        spare = [net for i, net in self._nets.items() if i not in keep]
        self._nets = {i: net for i, net in self._nets.items() if i in keep}
        # An id names one set of weights for good: only new ids need loading.
        with torch.no_grad():
            for league_id, weights in view.networks.items():
                if league_id not in self._nets:
                    net = spare.pop() if spare else self._make_net().eval()
                    load_named_arrays(net, weights)
                    self._nets[league_id] = net
        self._view = view


def attach_opponents(
    env: object,
    spec: OpponentsSpec | None,
    *,
    latest: nn.Module,
    make_net: Callable[[], nn.Module],
) -> OpponentPool | None:
    """Make the league's board the opponents of `env`'s games; None without a spec."""
    if spec is None:
        return None
    if not isinstance(env, TwoPlayerVectorEnv):
        raise ValueError("only a two-player game's env has opponents to draw")
    pool = OpponentPool(spec, env.rules, latest=latest, make_net=make_net, playing=env.playing)
    env.opponents = pool
    return pool


def finished_opponents(
    info: dict[str, object], ended: npt.NDArray[np.bool_], count: int
) -> npt.NDArray[np.int64]:
    """The opponent ids of the `count` episodes that `ended` ([E] bool) marks, in env order;
    NO_OPPONENT for every episode of an env that is no game."""
    opponents = info.get("opponent")
    if opponents is None:
        return np.full(count, NO_OPPONENT, dtype=np.int64)
    found = np.asarray(opponents, dtype=np.int64)[ended]
    if len(found) != count:
        raise RuntimeError(f"{count} episodes ended, but {len(found)} games")
    return found
