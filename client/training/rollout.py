"""Rollouts: T vector steps of E envs recorded for PPO, the on-policy counterpart of n-step rows.

Every vector step is recorded, autoreset steps included, so the arrays stay a
dense [T, E] grid and each step's successor is simply the next row. Gymnasium
autoresets in NEXT_STEP mode (fedrl.client.training.nstep): the step after an
episode's last one acts on the episode's FINAL observation, is ignored by the
env and returns the next episode's first observation with reward 0. Such a
step is no experience (`valid` is False there: no loss, no env-step count),
but its recorded value is V(final observation), exactly what a truncated
episode bootstraps from; `value` row T is V of the observation after the
last step, for the rollout's own end. So GAE needs no special case for
truncation: fedrl.client.training.ppo_learner.gae reads `value[t + 1]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedrl.client.training.nstep import EpisodeTally, StepStats

_FLOAT32 = np.dtype(np.float32)


@dataclass(frozen=True)
class Rollout:
    """T steps of E envs, time-major: what one PPO update learns from."""

    obs: np.ndarray
    """float32 [T, E, *obs_shape] (uint8 for images): what each action was chosen on."""
    action: np.ndarray
    """int64 [T, E] (Discrete) or float32 [T, E, d] (Box, the unclipped sample)."""
    log_prob: np.ndarray
    """float32 [T, E]: log π_old(a|s) of the acting policy."""
    value: np.ndarray
    """float32 [T + 1, E]: V_old(s_t); row T is V of the observation after the last step."""
    reward: np.ndarray
    """float32 [T, E]."""
    terminated: np.ndarray
    """bool [T, E]: the episode ended in a terminal state: nothing to bootstrap from."""
    truncated: np.ndarray
    """bool [T, E]: the episode was cut short (a time limit): bootstrap from V(final obs)."""
    valid: np.ndarray
    """bool [T, E]: False on autoreset steps, which are no experience."""

    @property
    def steps(self) -> int:
        return int(self.reward.shape[0])

    @property
    def envs(self) -> int:
        return int(self.reward.shape[1])

    def validate(
        self,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        obs_dtype: np.dtype[np.generic] = _FLOAT32,
    ) -> None:
        """Raise ValueError naming the first column whose dtype, shape or values are wrong."""
        t, e = self.steps, self.envs
        action_dtype = np.dtype(np.float32) if action_shape else np.dtype(np.int64)
        expected: tuple[tuple[str, np.dtype[np.generic], tuple[int, ...]], ...] = (
            ("obs", obs_dtype, (t, e, *obs_shape)),
            ("action", action_dtype, (t, e, *action_shape)),
            ("log_prob", np.dtype(np.float32), (t, e)),
            ("value", np.dtype(np.float32), (t + 1, e)),
            ("reward", np.dtype(np.float32), (t, e)),
            ("terminated", np.dtype(np.bool_), (t, e)),
            ("truncated", np.dtype(np.bool_), (t, e)),
            ("valid", np.dtype(np.bool_), (t, e)),
        )
        for name, dtype, shape in expected:
            column = getattr(self, name)
            if not isinstance(column, np.ndarray) or column.dtype != dtype:
                raise ValueError(f"Rollout.{name} must be a {dtype} array")
            if column.shape != shape:
                raise ValueError(f"Rollout.{name} has shape {column.shape}, expected {shape}")
            if dtype.kind == "f" and not np.all(np.isfinite(column)):
                raise ValueError(f"Rollout.{name} holds a NaN or infinite value")

    @staticmethod
    def concat(rollouts: Sequence[Rollout]) -> Rollout:
        """Side by side along the env axis (the rollouts of several actors, same T)."""
        if not rollouts:
            raise ValueError("Rollout.concat needs at least one rollout")
        if len({r.steps for r in rollouts}) != 1:
            raise ValueError("rollouts joined side by side must have the same length")
        return Rollout(
            obs=np.concatenate([r.obs for r in rollouts], axis=1),
            action=np.concatenate([r.action for r in rollouts], axis=1),
            log_prob=np.concatenate([r.log_prob for r in rollouts], axis=1),
            value=np.concatenate([r.value for r in rollouts], axis=1),
            reward=np.concatenate([r.reward for r in rollouts], axis=1),
            terminated=np.concatenate([r.terminated for r in rollouts], axis=1),
            truncated=np.concatenate([r.truncated for r in rollouts], axis=1),
            valid=np.concatenate([r.valid for r in rollouts], axis=1),
        )


class RolloutRecorder:
    """Records vector steps into a fresh [T, E] grid and keeps each env's episode tally.

    Whether an env's next step is an autoreset step carries over from one
    rollout to the next, as do the running episode returns and lengths.
    """

    def __init__(
        self,
        *,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        steps: int,
        obs_dtype: type[np.generic] = np.float32,
    ) -> None:
        """`obs_dtype`: float32, or uint8 for images."""
        if steps < 1:
            raise ValueError(f"a rollout needs at least one step, got {steps}")
        self._envs, self._steps = num_envs, steps
        self._obs_shape, self._action_shape = obs_shape, action_shape
        self._obs_dtype = obs_dtype
        self._resetting = np.zeros(num_envs, dtype=np.bool_)
        self._tally = EpisodeTally(num_envs)
        self._t = 0
        self._columns = self._allocate()

    def _allocate(self) -> dict[str, np.ndarray]:
        t, e = self._steps, self._envs
        return {
            "obs": np.zeros((t, e, *self._obs_shape), dtype=self._obs_dtype),
            "action": np.zeros(
                (t, e, *self._action_shape),
                dtype=np.float32 if self._action_shape else np.int64,
            ),
            "log_prob": np.zeros((t, e), dtype=np.float32),
            "value": np.zeros((t + 1, e), dtype=np.float32),
            "reward": np.zeros((t, e), dtype=np.float32),
            "terminated": np.zeros((t, e), dtype=np.bool_),
            "truncated": np.zeros((t, e), dtype=np.bool_),
            "valid": np.zeros((t, e), dtype=np.bool_),
        }

    @property
    def full(self) -> bool:
        return self._t == self._steps

    def add(  # noqa: PLR0917 (one column each, in the Rollout's order)
        self,
        obs: npt.NDArray[np.float32],
        action: np.ndarray,
        log_prob: npt.NDArray[np.float32],
        value: npt.NDArray[np.float32],
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        score: np.ndarray | None = None,
    ) -> StepStats:
        """Record one vector step: what was acted on, chosen and returned.

        `score`: what the episode returns add up where it is not the reward
        learned from (a game's raw score, where the reward is clipped).
        """
        if self.full:
            raise RuntimeError("the rollout is full: call finish() first")
        valid = ~self._resetting
        terminated = np.asarray(terminated, dtype=np.bool_) & valid
        truncated = np.asarray(truncated, dtype=np.bool_) & valid
        reward32 = np.asarray(reward, dtype=np.float32) * valid
        c, t = self._columns, self._t
        c["obs"][t] = obs
        c["action"][t] = action
        c["log_prob"][t] = log_prob
        c["value"][t] = value
        c["reward"][t] = reward32
        c["terminated"][t] = terminated
        c["truncated"][t] = truncated
        c["valid"][t] = valid
        self._t += 1

        done = terminated | truncated
        stats = self._tally.step(
            reward32 if score is None else np.asarray(score) * valid, valid, done
        )
        self._resetting = done
        return stats

    def finish(self, last_value: npt.NDArray[np.float32]) -> Rollout:
        """The full rollout, with V of the observation after its last step; starts the next."""
        if not self.full:
            raise RuntimeError(f"the rollout has {self._t} of {self._steps} steps")
        c = self._columns
        c["value"][self._steps] = last_value
        self._columns, self._t = self._allocate(), 0
        return Rollout(**c)
