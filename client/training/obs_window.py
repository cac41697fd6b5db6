"""Each env's last k observations, for the transformer policy; a window never spans two episodes.

A window is float32 [k, features + 1], oldest step first and the newest
last. The extra last column is 1 on steps of the current episode and 0 on
the zero padding before its first step, which the transformer masks out.
`WindowedVectorEnv` keeps the windows inside a vector env, so actors,
evaluation and everything else that steps envs sees windows as its
observations, and the learner stores and trains on them like any other.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium.vector.utils import batch_space

FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]


def windowed_shape(obs_shape: tuple[int, ...], context: int) -> tuple[int, int]:
    """The window of `context` observations of `obs_shape`: (context, features + 1)."""
    return context, math.prod(obs_shape) + 1


class ObservationWindow:
    """Windows of `num_envs` envs. Every call returns a new array; none is changed afterwards."""

    def __init__(self, num_envs: int, obs_shape: tuple[int, ...], context: int) -> None:
        if context < 1:
            raise ValueError(f"a window holds at least one observation, got {context}")
        self._shape = (num_envs, *windowed_shape(obs_shape, context))
        self._windows: FloatArray = np.zeros(self._shape, dtype=np.float32)

    def reset(self, obs: npt.NDArray[Any]) -> FloatArray:
        """Every env starts an episode with `obs`: padding, then `obs`."""
        return self.push(obs, starts=np.ones(self._shape[0], dtype=np.bool_))

    def push(self, obs: npt.NDArray[Any], *, starts: BoolArray) -> FloatArray:
        """Append each env's new observation; envs in `starts` begin a new episode with it."""
        num_envs, _, width = self._shape
        newest = np.ones((num_envs, 1, width), dtype=np.float32)
        newest[:, 0, :-1] = np.asarray(obs, dtype=np.float32).reshape(num_envs, -1)
        past = np.where(starts[:, None, None], np.float32(0.0), self._windows[:, 1:])
        self._windows = np.concatenate([past, newest], axis=1)
        return self._windows


class WindowedVectorEnv(gym.vector.VectorWrapper):
    """A vector env whose observations are each env's window of its last `context` observations.

    Autoreset is NEXT_STEP (fedrl.client.training.nstep): the step after an
    episode's last one returns the first observation of the next episode, so
    that step starts a new window; the final observation itself still joins
    the old episode's window, which is what a truncated episode bootstraps from.
    """

    def __init__(self, env: gym.vector.VectorEnv, context: int) -> None:
        super().__init__(env)
        mode = env.metadata.get("autoreset_mode")
        if mode not in (None, gym.vector.AutoresetMode.NEXT_STEP):
            raise ValueError(f"observation windows need NEXT_STEP autoreset, the env uses {mode}")
        space = env.single_observation_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(f"observation windows need a Box observation space, got {space}")
        flag = np.ones((context, 1), dtype=np.float32)
        low = np.concatenate([np.tile(space.low.reshape(1, -1), (context, 1)), 0 * flag], axis=1)
        high = np.concatenate([np.tile(space.high.reshape(1, -1), (context, 1)), flag], axis=1)
        # Padding is zeros, which a space not containing zero would not admit.
        low[:, :-1] = np.minimum(low[:, :-1], 0.0)
        high[:, :-1] = np.maximum(high[:, :-1], 0.0)
        self.single_observation_space = gym.spaces.Box(low, high, dtype=np.float32)
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)
        self._window = ObservationWindow(env.num_envs, space.shape, context)
        self._starting = np.zeros(env.num_envs, dtype=np.bool_)

    def reset(
        self, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[FloatArray, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._starting = np.zeros(self.num_envs, dtype=np.bool_)
        return self._window.reset(obs), info

    def step(self, actions: Any) -> tuple[FloatArray, Any, BoolArray, BoolArray, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        windows = self._window.push(obs, starts=self._starting)
        self._starting = np.asarray(terminated, dtype=np.bool_) | np.asarray(
            truncated, dtype=np.bool_
        )
        return windows, reward, terminated, truncated, info
