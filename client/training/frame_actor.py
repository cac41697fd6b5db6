"""Actors for games: ε-greedy on frame stacks, handing over each frame once.

The DQN actor of fedrl.client.training.actor, for envs whose observations
are stacks of frames (fedrl.envs.atari): it acts on the stacks, but what it
collects is a FrameSegment (fedrl.client.training.frame_segment), the newest
frame of each observation plus n-step transitions that name frames by step.
The n-step bookkeeping is NStepAccumulator's, run over step numbers instead
of observations.

What a game needs besides, and a Gymnasium env does not do for it:
- rewards are clipped to their sign for training (Mnih et al. 2015), while
  the raw score is what the episode returns (progress, evaluation and the
  server see) add up;
- with episodic life a lost life cuts the n-step return (discount 0) but
  not the game: its frames, its stack and its score go on, and the step
  after the loss is an ordinary transition (where Breakout must learn to
  serve again);
- an episode, for the counts and returns, is a whole game.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from fedrl.client.training.exploration import epsilon_greedy
from fedrl.client.training.frame_segment import FrameSegment
from fedrl.client.training.frame_slots import FrameSlot
from fedrl.client.training.nstep import NStepAccumulator
from fedrl.client.training.q_network import build_q_network
from fedrl.client.training.vector_env import (
    as_observations,
    env_shape,
    make_vector_env,
    reset_seeded,
)
from fedrl.client.training.weights_follower import WeightsFollower
from fedrl.envs.atari import lives

if TYPE_CHECKING:
    # Only a type here: actor.py imports this module to run frame actors.
    from fedrl.client.training.actor import ActorSpec


@dataclass(frozen=True)
class FrameActorSpec:
    """A DQN actor's spec and what a game adds to it."""

    actor: ActorSpec
    clip_rewards: bool
    """Train on the sign of each reward; scores stay raw."""
    episodic_life: bool
    """A lost life cuts the n-step return (discount 0); the game goes on."""

    @property
    def index(self) -> int:
        return self.actor.index


@dataclass(frozen=True)
class CollectedFrames:
    """One collection round: its frames and transitions, and the games that ended."""

    segment: FrameSegment
    env_steps: int
    episode_returns: npt.NDArray[np.float64]
    """Raw scores of the games that ended."""
    episode_lengths: npt.NDArray[np.int64]
    """Agent steps of those games."""


class FrameActorCore(WeightsFollower[nn.Module]):
    """Collects frame segments from one batch of game envs with per-env exploration rates."""

    def __init__(self, spec: FrameActorSpec) -> None:
        a = spec.actor
        if len(a.epsilons) != a.num_envs:
            raise ValueError(f"{a.num_envs} envs need as many epsilons, got {len(a.epsilons)}")
        self._spec = spec
        seeds = np.random.SeedSequence(a.seed_entropy, spawn_key=a.seed_spawn_key)
        env_seeds, action_seeds, torch_seed = seeds.spawn(3)
        self._env = make_vector_env(a.env_id, a.num_envs, a.data)
        shape = env_shape(self._env)
        self.obs_shape, self.n_actions = shape.obs_shape, shape.n_actions
        if len(self.obs_shape) != 3:
            raise ValueError(f"{a.env_id} observations are not frame stacks: {self.obs_shape}")
        self._rng = np.random.default_rng(action_seeds)
        torch.manual_seed(int(torch_seed.generate_state(1)[0]))
        self._net = build_q_network(
            self.obs_shape, self.n_actions, hidden=a.hidden, dueling=a.dueling, network=a.network
        )
        self._net.eval()
        self._eps = np.asarray(a.epsilons, dtype=np.float64)
        # Observations are named by id = step · E + env: the env and the step in one int.
        self._nstep = NStepAccumulator(
            num_envs=a.num_envs, obs_shape=(), n_step=a.n_step, gamma=a.gamma, obs_dtype=np.int64
        )
        self._obs = reset_seeded(self._env, env_seeds)
        envs = a.num_envs
        self._step = 0
        self._first = np.ones(envs, dtype=np.bool_)  # the reset observation starts a stack
        self._ended = np.zeros(envs, dtype=np.bool_)  # the last step ended the env's game
        self._lives = np.full(envs, -1, dtype=np.int64)  # -1: not known yet
        self._score = np.zeros(envs, dtype=np.float64)
        self._length = np.zeros(envs, dtype=np.int64)
        self._held = _Rows.empty()

    @property
    def env(self) -> gym.vector.VectorEnv:
        """The vector env this actor steps."""
        return self._env

    @property
    def num_envs(self) -> int:
        return self._spec.actor.num_envs

    def act(self, obs: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
        """ε-greedy with each env's own ε, from one batched forward pass over uint8 stacks."""
        with torch.inference_mode():
            greedy = self._net(torch.from_numpy(obs)).argmax(dim=1).numpy()
        return epsilon_greedy(greedy, self._eps, self.n_actions, self._rng)

    def collect(self, vector_steps: int) -> CollectedFrames:
        spec = self._spec
        envs = self._spec.actor.num_envs
        frames = np.empty((vector_steps, envs, *self.obs_shape[1:]), dtype=np.uint8)
        first = np.empty((vector_steps, envs), dtype=np.bool_)
        rows = [self._held]
        returns: list[npt.NDArray[np.float64]] = []
        lengths: list[npt.NDArray[np.int64]] = []
        env_steps = 0
        start = self._step
        ids = np.arange(envs, dtype=np.int64)
        for t in range(vector_steps):
            obs = self._obs
            frames[t], first[t] = obs[:, -1], self._first
            action = self.act(obs)
            next_obs, reward, terminated, truncated, info = self._env.step(action)
            terminated = np.asarray(terminated, dtype=np.bool_)
            truncated = np.asarray(truncated, dtype=np.bool_)
            score = np.asarray(reward, dtype=np.float64)
            valid = ~self._ended  # else this step only reset the env
            now = lives(info, envs)
            lost = valid & (now < self._lives) & ~(terminated | truncated)
            cut = lost if spec.episodic_life else np.zeros(envs, dtype=np.bool_)
            train = np.sign(score) if spec.clip_rewards else score
            batch, stats = self._nstep.push(
                obs=self._step * envs + ids,
                action=action,
                reward=train,
                next_obs=(self._step + 1) * envs + ids,
                terminated=terminated | cut,
                truncated=truncated,
                continues=cut,
            )
            rows.append(
                _Rows(batch.obs, batch.next_obs, batch.action, batch.reward, batch.discount)
            )
            env_steps += stats.env_steps
            # Scores: raw rewards, whole games.
            self._score += np.where(valid, score, 0.0)
            self._length += valid
            over = (terminated | truncated) & valid
            returns.append(self._score[over].copy())
            lengths.append(self._length[over].copy())
            self._score[over] = 0.0
            self._length[over] = 0
            # After a reset step the env returns a new game's first stack.
            self._first = ~valid
            self._ended = over
            self._lives = now
            self._obs = as_observations(next_obs)
            self._step += 1
        # Transitions whose bootstrap frame is the next step's wait for the next segment.
        every = _Rows.concat(rows)
        ready = every.next_id // envs < start + vector_steps
        now_rows, self._held = every.select(ready), every.select(~ready)
        return CollectedFrames(
            segment=FrameSegment(
                frames=frames,
                first=first,
                env=now_rows.obs_id % envs,
                obs_step=now_rows.obs_id // envs - start,
                next_step=now_rows.next_id // envs - start,
                action=now_rows.action,
                reward=now_rows.reward,
                discount=now_rows.discount,
            ),
            env_steps=env_steps,
            episode_returns=np.concatenate(returns),
            episode_lengths=np.concatenate(lengths),
        )

    def fill(self, slot: FrameSlot) -> tuple[int, int, int]:
        """Collect into a shared-memory slot; (rows, episodes, env steps) for the fill message."""
        got = self.collect(self._spec.actor.steps_per_slot)
        slot.write(got.segment, got.episode_returns, got.episode_lengths)
        return len(got.segment), len(got.episode_returns), got.env_steps

    def close(self) -> None:
        self._env.close()


@dataclass(frozen=True)
class _Rows:
    """n-step transitions over observation ids (step · E + env)."""

    obs_id: npt.NDArray[np.int64]
    next_id: npt.NDArray[np.int64]
    action: npt.NDArray[np.int64]
    reward: npt.NDArray[np.float32]
    discount: npt.NDArray[np.float32]

    @staticmethod
    def empty() -> _Rows:
        none = np.zeros(0, dtype=np.int64)
        return _Rows(none, none, none, none.astype(np.float32), none.astype(np.float32))

    @staticmethod
    def concat(parts: Sequence[_Rows]) -> _Rows:
        return _Rows(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(_Rows)))

    def select(self, keep: np.ndarray) -> _Rows:
        return _Rows(*(getattr(self, f.name)[keep] for f in fields(_Rows)))
