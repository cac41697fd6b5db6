"""A two-player game as a single-agent vector env: each step is the learner's move and the reply.

PettingZoo's classic games are AEC envs: the players take turns on one env.
`TwoPlayerVectorEnv` steps `num_envs` of them as one batch and shows the
learner's side only. Every game draws its opponent (`Opponents.draw`) and
the learner's seat (first or second, at random unless `seats` fixes them);
a step plays the learner's move and, unless that ended the game, the
opponent's reply, batched over the envs that face the same opponent. When
the opponent moves first it does so at the game's start. The reward is the
learner's outcome, +1 a win, −1 a loss, 0 a draw, on the step that ends
the game; every other step earns 0. The final observation of a game has an
empty mask: no move is legal any more. Games end by themselves, so nothing is
ever truncated.

Observations are from the mover's perspective (PettingZoo's planes: own
pieces, then the opponent's), flattened, with the legal-action mask at the
end (fedrl.envs.board_games). An illegal action is refused with ValueError
before anything moves: the learner's and the opponent's alike.

Autoreset is Gymnasium's NEXT_STEP, as for every env fedrl steps: the step
after a game's end starts the next game in that env, ignores its action,
and returns the new game's first observation with reward 0. `info` carries,
per env, the opponent id of its game and the learner's seat; after a game's
last step they still describe that game.

The raw env is stepped, not PettingZoo's wrapped one: the wrappers check
move order and legality, which this class does itself, and cost twice the
step (4.5k against 11.6k connect-four moves per second measured here).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fedrl.envs.board_games import (
    BASELINES,
    INSTALL_HINT,
    GameRules,
    Player,
    game_rules,
)

BoolArray = npt.NDArray[np.bool_]
ObsArray = npt.NDArray[np.float32]

NO_OPPONENT = -1
"""The opponent id of an episode that is not a game (any other env)."""
LATEST = 0
"""The opponent id of the learner's own latest policy (self-play)."""
BASELINE_IDS = {name: index + 1 for index, name in enumerate(BASELINES)}
"""Opponent ids of the fixed players: random 1, lookahead 2."""
FIRST_NETWORK_ID = 1 + len(BASELINES)
"""Ids from here on name networks of an opponent pool (snapshots, global versions)."""


class Opponents(Protocol):
    """Who plays the other seat: drawn for each game, asked for moves in batches."""

    def draw(self, rng: np.random.Generator) -> int:
        """The opponent id of a new game."""
        ...

    def act(
        self,
        opponent: int,
        obs: ObsArray,
        legal: BoolArray,
        rng: np.random.Generator,
    ) -> npt.NDArray[np.int64]:
        """Moves of `opponent` on observations [B, D] from its perspective, legal [B, A]."""
        ...


class Baseline:
    """One fixed player (random or lookahead) in every game."""

    def __init__(self, rules: GameRules, name: str = "random") -> None:
        if name not in BASELINES:
            raise ValueError(f"no baseline {name!r}; there are {', '.join(BASELINES)}")
        self.id = BASELINE_IDS[name]
        self._player: Player = BASELINES[name](rules)

    def draw(self, rng: np.random.Generator) -> int:
        return self.id

    def act(
        self, opponent: int, obs: ObsArray, legal: BoolArray, rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        return self._player(obs, legal, rng)


def make_game(rules: GameRules, *, render: bool = False) -> Any:
    """PettingZoo's raw AEC env of the game (rendering rgb_array frames with `render`)."""
    try:
        pettingzoo = importlib.import_module("pettingzoo")
    except ImportError as exc:
        raise ValueError(INSTALL_HINT) from exc
    env = pettingzoo.make(
        "aec", f"classic/{rules.name}", render_mode="rgb_array" if render else None
    )
    return env.unwrapped


class TwoPlayerVectorEnv(VectorEnv[ObsArray, npt.NDArray[np.int64], npt.NDArray[Any]]):
    """`num_envs` games of `env_id` (`pettingzoo/connect_four_v3`), the learner's side of each."""

    metadata: dict[str, Any] = {  # noqa: RUF012 (Gymnasium's convention)
        "render_modes": ["rgb_array"],
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        "action_mask": True,
    }

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        opponents: Opponents | None = None,
        seats: Sequence[int] | None = None,
        render: bool = False,
    ) -> None:
        """`opponents`: the uniform random player when None. `seats`: the learner's seat in each
        env (0 moves first, 1 second) for every game; None draws it per game."""
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.rules = game_rules(env_id)
        if seats is not None and (
            len(seats) != num_envs or any(seat not in (0, 1) for seat in seats)
        ):
            raise ValueError(f"seats must be {num_envs} values of 0 or 1, got {list(seats)}")
        self.num_envs = num_envs
        self._games = [make_game(self.rules, render=render) for _ in range(num_envs)]
        self._agents: list[str] = list(self._games[0].possible_agents)
        self._render = render
        self.opponents: Opponents = opponents if opponents is not None else Baseline(self.rules)
        self._fixed_seats = None if seats is None else np.asarray(seats, dtype=np.int64)
        rules = self.rules
        self.single_observation_space = gym.spaces.Box(
            0.0, 1.0, shape=(rules.obs_size,), dtype=np.float32
        )
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.single_action_space = gym.spaces.Discrete(rules.actions)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._rng = np.random.default_rng()
        self._seat = np.zeros(num_envs, dtype=np.int64)
        self._opponent = np.full(num_envs, LATEST, dtype=np.int64)
        self._obs = np.zeros((num_envs, rules.obs_size), dtype=np.float32)
        self._done = np.zeros(num_envs, dtype=np.bool_)
        self._started = False

    # -- the vector env ---------------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[ObsArray, dict[str, Any]]:
        if seed is not None:
            if not isinstance(seed, int):
                raise ValueError("a two-player vector env takes one int seed for all its games")
            self._rng = np.random.default_rng(seed)
        self._new_games(np.arange(self.num_envs))
        self._done[:] = False
        self._started = True
        return self._obs.copy(), self._info()

    def step(
        self, actions: npt.ArrayLike
    ) -> tuple[ObsArray, npt.NDArray[np.float64], BoolArray, BoolArray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        chosen = np.asarray(actions)
        if chosen.shape != (self.num_envs,) or chosen.dtype.kind not in "iu":
            raise ValueError(
                f"actions must be {self.num_envs} integers, got shape {chosen.shape} "
                f"of {chosen.dtype}"
            )
        restart, live = self._done, ~self._done
        live_envs = np.flatnonzero(live)
        self._check_legal(
            live_envs, chosen[live_envs], self._legal(self._obs[live_envs]), "the learner"
        )
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        if restart.any():
            self._new_games(np.flatnonzero(restart))
        for env in live_envs:
            self._games[env].step(int(chosen[env]))
        over = self._over(live_envs)
        self._opponent_moves(live_envs[~over])
        for env in live_envs:
            game = self._games[env]
            if game.terminations[self._agents[0]]:
                terminated[env] = True
                rewards[env] = float(game.rewards[self._agents[self._seat[env]]])
            self._obs[env] = self._observe(int(env), int(self._seat[env]))
            if terminated[env]:
                # A finished game has no legal move left, whoever's turn PettingZoo names.
                self._obs[env, 2 * self.rules.cells :] = 0.0
        self._done = terminated.copy()
        return self._obs.copy(), rewards, terminated, np.zeros_like(terminated), self._info()

    def render(self) -> tuple[npt.NDArray[np.uint8], ...]:
        """Each env's board as an rgb_array frame."""
        if not self._render:
            raise RuntimeError("make the env with render=True to render it")
        return tuple(np.asarray(game.render(), dtype=np.uint8) for game in self._games)

    def close(self, **kwargs: Any) -> None:
        for game in self._games:
            game.close()
        super().close(**kwargs)

    def seats(self) -> npt.NDArray[np.int64]:
        """The learner's seat in each env's game (0: it moves first)."""
        return self._seat.copy()

    def playing(self) -> npt.NDArray[np.int64]:
        """The opponent id of each env's game under way (or just ended)."""
        return self._opponent.copy()

    # -- games ------------------------------------------------------------------

    def _info(self) -> dict[str, Any]:
        return {"opponent": self._opponent.copy(), "seat": self._seat.copy()}

    def _new_games(self, envs: npt.NDArray[np.int64]) -> None:
        """Fresh games in `envs`, each with its opponent and seat; the opponent's first moves."""
        for env in envs:
            self._games[env].reset()
            self._opponent[env] = self.opponents.draw(self._rng)
            self._seat[env] = (
                self._rng.integers(2) if self._fixed_seats is None else self._fixed_seats[env]
            )
        self._opponent_moves(envs[self._seat[envs] == 1])
        for env in envs:
            self._obs[env] = self._observe(int(env), int(self._seat[env]))

    def _opponent_moves(self, envs: npt.NDArray[np.int64]) -> None:
        """The opponent's move in each of `envs`, one batch per opponent."""
        if not len(envs):
            return
        for opponent in np.unique(self._opponent[envs]):
            facing = envs[self._opponent[envs] == opponent]
            obs = np.stack([self._observe(int(env), int(1 - self._seat[env])) for env in facing])
            legal = self._legal(obs)
            moves = np.asarray(
                self.opponents.act(int(opponent), obs, legal, self._rng), dtype=np.int64
            )
            if moves.shape != (len(facing),):
                raise ValueError(
                    f"opponent {opponent} answered {moves.shape} moves for {len(facing)} games"
                )
            self._check_legal(facing, moves, legal, f"opponent {opponent}")
            for env, move in zip(facing, moves, strict=True):
                self._games[env].step(int(move))

    def _observe(self, env: int, seat: int) -> ObsArray:
        seen = self._games[env].observe(self._agents[seat])
        return np.concatenate(
            [seen["observation"].reshape(-1), seen["action_mask"]], dtype=np.float32
        )

    def _over(self, envs: npt.NDArray[np.int64]) -> BoolArray:
        return np.array(
            [bool(self._games[env].terminations[self._agents[0]]) for env in envs], dtype=np.bool_
        )

    def _legal(self, obs: ObsArray) -> BoolArray:
        legal: BoolArray = obs[:, 2 * self.rules.cells :] > 0.5
        return legal

    def _check_legal(
        self,
        envs: npt.NDArray[np.int64],
        actions: npt.NDArray[np.int64],
        legal: BoolArray,
        who: str,
    ) -> None:
        """ValueError naming the first illegal action, before any of them is played."""
        rows = np.arange(len(envs))
        inside = (actions >= 0) & (actions < self.rules.actions)
        ok = inside.copy()
        ok[inside] = legal[rows[inside], actions[inside]]
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise ValueError(
                f"{who} played {actions[bad]} in env {envs[bad]}, an illegal move of "
                f"{self.rules.name} there (legal: {np.flatnonzero(legal[bad]).tolist()})"
            )
