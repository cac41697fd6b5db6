"""n-step transitions from a batch of vectorised envs, never across an episode boundary.

Gymnasium 1.x vector envs autoreset in NEXT_STEP mode by default, and the
native numpy CartPole supports no other mode: the step that reports
terminated/truncated returns the episode's real final observation, and the
*next* call resets that env, ignoring its action, and returns the first
observation of the new episode with reward 0. We keep that mode for every env
(one code path, and the final observation arrives in the observation array,
not in an info dict) and drop the reset step's pseudo-transition here.

Bookkeeping is vectorised over envs: all envs step together, so a ring of n
slots indexed by the global step count serves every env at once. An entry
lives in slot `t mod n` from its step t until it has accumulated n rewards
or its episode ends; either happens before step t+n reuses the slot, because
a reset step (the only step an env does not add to its entries) always follows
a flush.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fedrl.client.training.transitions import LearnerTransitions

FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class StepStats:
    """What one vector step did besides transitions.

    `env_steps` counts real env steps only: autoreset steps are no experience.
    """

    env_steps: int
    episode_returns: npt.NDArray[np.float64]
    episode_lengths: npt.NDArray[np.int64]


class EpisodeTally:
    """Each env's running episode return and length, reported as StepStats when episodes end.

    Steps that belong to no episode (autoreset steps) come with valid False
    and zero reward, so they add to neither figure.
    """

    def __init__(self, num_envs: int) -> None:
        self._return = np.zeros(num_envs, dtype=np.float64)
        self._length = np.zeros(num_envs, dtype=np.int64)

    def step(
        self, rewards: np.ndarray, valid: npt.NDArray[np.bool_], done: npt.NDArray[np.bool_]
    ) -> StepStats:
        """Adds one vector step; the episodes that `done` ends are reported and start afresh."""
        self._return += rewards
        self._length += valid
        stats = StepStats(
            env_steps=int(valid.sum()),
            episode_returns=self._return[done].copy(),
            episode_lengths=self._length[done].copy(),
        )
        self._return[done] = 0.0
        self._length[done] = 0
        return stats


class NStepAccumulator:
    """Turns per-step vector-env output into n-step `LearnerTransitions` rows.

    Row fields follow the learner's contract: `reward` is the discounted sum of
    the k ≤ n rewards, `discount` is gamma**k, or 0 when the episode
    terminated within those k steps; a truncated episode bootstraps from its
    final observation.
    """

    def __init__(
        self,
        *,
        num_envs: int,
        obs_shape: tuple[int, ...],
        n_step: int,
        gamma: float,
        obs_dtype: type[np.generic] = np.float32,
    ) -> None:
        """`obs_dtype`: float32 observations, uint8 images, or int64 step numbers standing for
        frames kept elsewhere (fedrl.client.training.frame_actor)."""
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self._n = n_step
        self._gamma_pow = (gamma ** np.arange(n_step + 1)).astype(np.float32)
        self._obs = np.zeros((n_step, num_envs, *obs_shape), dtype=obs_dtype)
        self._action = np.zeros((n_step, num_envs), dtype=np.int64)
        self._ret = np.zeros((n_step, num_envs), dtype=np.float32)
        self._age = np.zeros((n_step, num_envs), dtype=np.int64)
        self._live = np.zeros((n_step, num_envs), dtype=np.bool_)
        # Envs whose previous step ended an episode: their next step is the
        # autoreset step, whose (obs, action, reward) belong to no episode.
        self._resetting = np.zeros(num_envs, dtype=np.bool_)
        self._tally = EpisodeTally(num_envs)
        self._t = 0

    def push(
        self,
        *,
        obs: npt.NDArray[Any],
        action: npt.NDArray[np.int64],
        reward: npt.NDArray[np.floating],
        next_obs: npt.NDArray[Any],
        terminated: BoolArray,
        truncated: BoolArray,
        continues: BoolArray | None = None,
        opponent: npt.NDArray[np.int64] | None = None,
    ) -> tuple[LearnerTransitions, StepStats]:
        """Add one vector step; returns the rows it completed and the episodes it ended.

        `obs` is what the actions were chosen on, `next_obs` what `step`
        returned (the final observation for envs that just ended).
        `continues`: envs whose termination cuts the return but not the env,
        which steps on without a reset (a game's lost life, as an episode).
        `opponent`: two-player games' opponent of each env's game, given to the
        rows this step completes (a row completes within the game it began in).
        """
        valid = ~self._resetting
        done = (terminated | truncated) & valid
        # Zero on reset steps, so that multiplying by it leaves entries alone.
        reward32 = reward.astype(np.float32) * valid

        # Older entries of each valid env take this reward at their own age's
        # discount, then age by one step. Dead entries may accumulate garbage:
        # a new entry overwrites every field before it goes live.
        self._ret += self._gamma_pow[self._age] * reward32
        self._age += valid

        # This step starts a new entry in its slot (whole rows: on a reset
        # step the entry stays dead, whatever it holds).
        slot = self._t % self._n
        self._obs[slot] = obs
        self._action[slot] = action
        self._ret[slot] = reward32
        self._age[slot] = 1
        self._live[slot] = valid

        # Entries that have n rewards, or whose episode just ended, are complete.
        emit = self._live & ((self._age == self._n) | done[None, :])
        slots, envs = np.nonzero(emit)
        age = self._age[slots, envs]
        discount = self._gamma_pow[age] * (~terminated[envs]).astype(np.float32)
        batch = LearnerTransitions(
            obs=self._obs[slots, envs],
            action=self._action[slots, envs],
            reward=self._ret[slots, envs].copy(),
            next_obs=np.ascontiguousarray(next_obs[envs], dtype=self._obs.dtype),
            discount=discount.astype(np.float32),
            opponent=None if opponent is None else opponent[envs].astype(np.int64),
        )
        self._live[emit] = False

        # Episode bookkeeping for metrics; the reset step counts toward neither.
        stats = self._tally.step(reward32, valid, done)

        self._resetting = done if continues is None else done & ~continues
        self._t += 1
        return batch, stats

    @property
    def pending(self) -> int:
        """Entries still waiting for rewards; they are lost only if the run stops mid-episode."""
        return int(self._live.sum())
