"""PPO's actors: E envs stepped as one batch, actions sampled from a CPU copy of the actor-critic.

The on-policy counterpart of fedrl.client.training.actor.ActorCore: no
exploration schedule (the policy's own randomness explores), and instead of
n-step transitions it records a whole rollout of `steps_per_slot` vector
steps with each action's log-probability and each state's value. The same
actor processes, shared memory and serial mode serve both
(fedrl.client.training.actor.actor_process).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.opponent_pool import (
    OpponentsSpec,
    attach_opponents,
    finished_opponents,
)
from fedrl.client.training.policy_network import ActorCritic, build_actor_critic
from fedrl.client.training.rollout import Rollout, RolloutRecorder
from fedrl.client.training.shm import RolloutSlot
from fedrl.client.training.vector_env import (
    as_observations,
    env_shape,
    make_vector_env,
    reset_seeded,
)
from fedrl.client.training.weights_follower import WeightsFollower


@dataclass(frozen=True)
class PPOActorSpec:
    """Everything one PPO actor needs, in plain values (it crosses the spawn boundary)."""

    index: int
    env_id: str
    data: str | None
    num_envs: int
    seed_entropy: int
    seed_spawn_key: tuple[int, ...]
    steps_per_slot: int
    """Vector steps per rollout."""
    hidden: tuple[int, ...]
    network: NetworkConfig
    clip_rewards: bool = False
    """Learn from the sign of each reward (games); episode returns stay the raw score."""
    opponents: OpponentsSpec | None = None
    """Two-player games: the league's board the opponents are drawn from."""


@dataclass(frozen=True)
class CollectedRollout:
    """One rollout and what else happened while it was collected."""

    rollout: Rollout
    env_steps: int
    episode_returns: npt.NDArray[np.float64]
    episode_lengths: npt.NDArray[np.int64]
    episode_opponents: npt.NDArray[np.int64]
    """Two-player games: each ended episode's opponent id (NO_OPPONENT elsewhere)."""


class PPOActorCore(WeightsFollower[ActorCritic]):
    """Collects rollouts from one env batch with the newest policy it was given."""

    def __init__(self, spec: PPOActorSpec) -> None:
        self._spec = spec
        seeds = np.random.SeedSequence(spec.seed_entropy, spawn_key=spec.seed_spawn_key)
        env_seeds, action_seeds, torch_seed = seeds.spawn(3)
        self._env = make_vector_env(
            spec.env_id, spec.num_envs, spec.data, window=spec.network.window
        )
        self.shape = env_shape(self._env, continuous=True)
        self.obs_shape = self.shape.obs_shape
        self.action_shape: tuple[int, ...] = () if self.shape.discrete else (self.shape.action_dim,)
        # Sampling draws from a generator of its own: reproducible whatever
        # else in the process touches torch's global one.
        self._generator = torch.Generator().manual_seed(int(action_seeds.generate_state(1)[0]))
        torch.manual_seed(int(torch_seed.generate_state(1)[0]))

        def actor_critic() -> ActorCritic:
            return build_actor_critic(
                self.obs_shape, self.shape, hidden=spec.hidden, network=spec.network
            ).eval()

        self._net = actor_critic()
        self._opponents = attach_opponents(
            self._env, spec.opponents, latest=self._net, make_net=actor_critic
        )
        self._low = np.asarray(self.shape.action_low, dtype=np.float32)
        self._high = np.asarray(self.shape.action_high, dtype=np.float32)
        self._obs = reset_seeded(self._env, env_seeds)
        self._recorder = RolloutRecorder(
            num_envs=spec.num_envs,
            obs_shape=self.obs_shape,
            action_shape=self.action_shape,
            steps=spec.steps_per_slot,
            obs_dtype=self._obs.dtype.type,
        )

    def collect(self) -> CollectedRollout:
        """One rollout of `steps_per_slot` vector steps."""
        returns: list[npt.NDArray[np.float64]] = []
        lengths: list[npt.NDArray[np.int64]] = []
        opponents: list[npt.NDArray[np.int64]] = []
        env_steps = 0
        net = self._net
        with torch.inference_mode():
            while not self._recorder.full:
                obs = self._obs
                params, value = net(torch.from_numpy(obs))
                action = net.sample(params, self._generator)
                log_prob = net.log_prob(params, action)
                chosen = action.numpy()
                to_env = chosen if self.shape.discrete else np.clip(chosen, self._low, self._high)
                next_obs, reward, terminated, truncated, info = self._env.step(to_env)
                score = np.asarray(reward, dtype=np.float64)
                stats = self._recorder.add(
                    obs,
                    chosen,
                    log_prob.numpy(),
                    value.numpy(),
                    np.sign(score) if self._spec.clip_rewards else score,
                    terminated,
                    truncated,
                    score=score,
                )
                returns.append(stats.episode_returns)
                lengths.append(stats.episode_lengths)
                ended = np.asarray(terminated, dtype=np.bool_) | np.asarray(
                    truncated, dtype=np.bool_
                )
                opponents.append(finished_opponents(info, ended, len(stats.episode_returns)))
                env_steps += stats.env_steps
                self._obs = as_observations(next_obs)
            _, last_value = net(torch.from_numpy(self._obs))
        return CollectedRollout(
            rollout=self._recorder.finish(last_value.numpy()),
            env_steps=env_steps,
            episode_returns=np.concatenate(returns),
            episode_lengths=np.concatenate(lengths),
            episode_opponents=np.concatenate(opponents),
        )

    def fill(self, slot: RolloutSlot) -> tuple[int, int, int]:
        """Collect into a shared-memory slot; (rows, episodes, env steps) for the fill message."""
        got = self.collect()
        slot.write(
            got.rollout, got.episode_returns, got.episode_lengths, opponents=got.episode_opponents
        )
        return got.rollout.steps * got.rollout.envs, len(got.episode_returns), got.env_steps

    def close(self) -> None:
        if self._opponents is not None:
            self._opponents.close()
        self._env.close()
