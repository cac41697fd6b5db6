"""Native vector version of `fedrl/Trading-v0`: N accounts stepped by one numpy call.

It behaves exactly like Gymnasium's SyncVectorEnv over N TradingEnv (same observations,
rewards and ends for the same seed and actions; sub-env i is seeded seed + i), with
Gymnasium's default NEXT_STEP autoreset: the step after an episode ends ignores that env's
action and returns the first observation of its next episode, with reward 0 and no end flags.
With many symbols each env trades a symbol drawn for each episode from its own stream.
Infos are empty: per-env dicts would cost more than the step itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fedrl.envs.trading import (
    ENV_ID,
    Book,
    ObsArray,
    episode_starts,
    load_market,
    observation_space,
    observe,
    target_positions,
)
from fedrl.envs.trading_config import TradingConfig

BoolArray = npt.NDArray[np.bool_]


class TradingVectorEnv(VectorEnv[ObsArray, npt.NDArray[np.int64], npt.NDArray[Any]]):
    """`gymnasium.make_vec("fedrl/Trading-v0", num_envs=N, data=..., ...)`."""

    metadata: dict[str, Any] = {  # noqa: RUF012 (Gymnasium's convention)
        "render_modes": [],
        "autoreset_mode": AutoresetMode.NEXT_STEP,
    }

    def __init__(
        self,
        num_envs: int = 1,
        config: TradingConfig | None = None,
        *,
        render_mode: str | None = None,
        **options: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        if render_mode is not None:
            raise ValueError(f"{ENV_ID} has no render modes, got render_mode={render_mode!r}")
        self.num_envs = num_envs
        self.config = TradingConfig.from_kwargs(config, **options)
        self.market = load_market(self.config)
        self._starts = episode_starts(self.market, self.config)
        self._targets = target_positions(self.config.allow_short)
        self.single_action_space = gym.spaces.Discrete(len(self._targets))
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.single_observation_space = observation_space(
            self.config.window, self.market.data.indicator_names
        )
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self._book = Book(
            n=num_envs,
            close=self.market.close,
            fee_bps=self.config.fee_bps,
            slippage_bps=self.config.slippage_bps,
        )
        self._rngs = [seeding.np_random(None)[0] for _ in range(num_envs)]
        self._done = np.zeros(num_envs, dtype=np.bool_)
        self._last = np.zeros(num_envs, dtype=np.int64)
        """Each env's episode ends at this bar: the last of its symbol's split."""
        self._started = False

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[ObsArray, dict[str, Any]]:
        seeds = _sub_env_seeds(seed, self.num_envs)
        super().reset(seed=seed if isinstance(seed, int) else None)
        for i, sub_seed in enumerate(seeds):
            # Like Gymnasium's envs, an unseeded reset continues the env's own stream.
            if sub_seed is not None:
                self._rngs[i] = seeding.np_random(sub_seed)[0]
        self._open(np.arange(self.num_envs))
        self._done[:] = False
        self._started = True
        return observe(self.market, self._book, self.config.window), {}

    def step(
        self, actions: npt.ArrayLike
    ) -> tuple[ObsArray, npt.NDArray[np.float64], BoolArray, BoolArray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        chosen = self._checked_actions(actions)
        restart = self._done
        live = ~restart
        if restart.any():
            self._open(np.flatnonzero(restart))
        # Restarted envs stay flat on their first bar: no trade, no move, reward 0.
        target = np.where(live, self._targets[chosen], self._book.position)
        rewards, ruined = self._book.step(target, advance=live)
        terminated = ruined & live
        truncated = live & ~terminated & (self._book.bar >= self._last)
        if self.config.episode_length is not None:
            truncated |= live & ~terminated & (self._book.steps >= self.config.episode_length)
        self._done = terminated | truncated
        obs = observe(self.market, self._book, self.config.window)
        return obs, rewards, terminated, truncated, {}

    def _open(self, which: npt.NDArray[np.intp]) -> None:
        """Start envs `which` on a symbol and bar each draws from its own stream."""
        drawn = [self._starts.draw(self._rngs[i]) for i in which]
        symbols = np.array([symbol for symbol, _ in drawn], dtype=np.int64)
        self._last[which] = self._starts.last[symbols]
        self._book.open(which, np.array([start for _, start in drawn], dtype=np.int64))

    def _checked_actions(self, actions: npt.ArrayLike) -> npt.NDArray[np.intp]:
        chosen = np.asarray(actions)
        if chosen.shape != (self.num_envs,) or chosen.dtype.kind not in "iu":
            raise ValueError(
                f"actions must be {self.num_envs} integers, got shape {chosen.shape} "
                f"of {chosen.dtype}"
            )
        if chosen.min() < 0 or chosen.max() >= len(self._targets):
            raise ValueError(
                f"actions must lie in [0, {len(self._targets) - 1}], got {chosen.min()} "
                f"to {chosen.max()}"
            )
        return chosen.astype(np.intp, copy=False)


def _sub_env_seeds(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    """Per-env seeds as SyncVectorEnv gives them: seed + i, or one per env from a list."""
    if seed is None:
        return [None] * n
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ValueError(f"reset got {len(seeds)} seeds for {n} envs")
    return seeds
