"""n-step transitions never cross an episode boundary, and truncation bootstraps.

A tiny deterministic env makes every row checkable: the observation carries
(episode id, step within the episode), the reward of step t is t, and episode
lengths vary per instance, some cut by a time limit.
"""

from __future__ import annotations

import itertools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from fedrl.client.training.actor import ActorCore, ActorSpec
from fedrl.client.training.nstep import NStepAccumulator
from fedrl.client.training.transitions import LearnerTransitions

ENV_ID = "FedrlTestCounting-v0"
TIME_LIMIT = 5
_instances = itertools.count()


class CountingEnv(gym.Env[np.ndarray, np.int64]):
    """obs = (episode id, t); step t pays t; episode k of instance i lasts 2 + (i + k) % 5 steps."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self._instance = next(_instances)
        self._episode = -1
        self._t = 0
        self._length = 0

    def _obs(self) -> np.ndarray:
        uid = self._instance * 1000 + self._episode
        return np.array([uid, self._t], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._episode += 1
        self._t = 0
        self._length = 2 + (self._instance + self._episode) % 5
        return self._obs(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._t += 1
        return self._obs(), float(self._t), self._t >= self._length, False, {}


gym.register(ENV_ID, entry_point=lambda **_: CountingEnv(), max_episode_steps=TIME_LIMIT)


def length_of(uid: float) -> int:
    instance, episode = divmod(int(uid), 1000)
    return 2 + (instance + episode) % 5


def check_rows(batch: LearnerTransitions, *, n_step: int, gamma: float) -> None:
    """Every row against the env's known dynamics."""
    for obs, reward, next_obs, discount in zip(
        batch.obs, batch.reward, batch.next_obs, batch.discount, strict=True
    ):
        uid, start = obs
        assert next_obs[0] == uid, f"transition crosses from episode {uid} to {next_obs[0]}"
        k = int(next_obs[1] - start)
        end = min(length_of(uid), TIME_LIMIT)
        ended = next_obs[1] == end
        assert 1 <= k <= n_step
        assert k == n_step or ended, "a short transition must end its episode"
        expected_reward = sum(gamma**j * (start + 1 + j) for j in range(k))
        assert reward == pytest.approx(expected_reward, rel=1e-6)
        terminated = ended and length_of(uid) <= TIME_LIMIT
        assert discount == pytest.approx(0.0 if terminated else gamma**k, rel=1e-6)


def drive(num_envs: int, steps: int, *, n_step: int, gamma: float) -> list[LearnerTransitions]:
    env = gym.make_vec(ENV_ID, num_envs=num_envs, vectorization_mode="sync")
    acc = NStepAccumulator(num_envs=num_envs, obs_shape=(2,), n_step=n_step, gamma=gamma)
    obs, _ = env.reset(seed=0)
    out = []
    for _ in range(steps):
        action = np.zeros(num_envs, dtype=np.int64)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        batch, _ = acc.push(
            obs=obs,
            action=action,
            reward=reward,
            next_obs=next_obs,
            terminated=terminated,
            truncated=truncated,
        )
        out.append(batch)
        obs = next_obs
    env.close()
    return out


@pytest.mark.parametrize("n_step", [1, 3, 4])
def test_no_transition_crosses_an_episode_boundary(n_step: int) -> None:
    # prepare / act
    batches = drive(num_envs=4, steps=60, n_step=n_step, gamma=0.9)

    # assert
    check_rows(LearnerTransitions.concat(batches), n_step=n_step, gamma=0.9)


def test_every_step_of_a_finished_episode_starts_exactly_one_transition() -> None:
    # prepare / act
    batch = LearnerTransitions.concat(drive(num_envs=3, steps=40, n_step=3, gamma=0.9))

    # assert: group starts by episode; episodes that ended are complete, once each
    starts: dict[int, list[int]] = {}
    for uid, t in batch.obs:
        starts.setdefault(int(uid), []).append(int(t))
    finished = {int(uid) for uid, t in batch.next_obs if t == min(length_of(uid), TIME_LIMIT)}
    assert finished
    for uid in finished:
        assert sorted(starts[uid]) == list(range(min(length_of(uid), TIME_LIMIT)))


def test_truncated_episode_bootstraps_and_terminated_one_does_not() -> None:
    # prepare / act
    batch = LearnerTransitions.concat(drive(num_envs=5, steps=40, n_step=2, gamma=0.5))

    # assert: length-6 episodes are cut at the time limit of 5, length<=5 ones terminate
    last = batch.next_obs[:, 1] == np.minimum([length_of(u) for u in batch.obs[:, 0]], TIME_LIMIT)
    truncated = last & (np.array([length_of(u) for u in batch.obs[:, 0]]) > TIME_LIMIT)
    terminated = last & ~truncated
    assert truncated.any() and terminated.any()
    assert np.all(batch.discount[truncated] > 0.0)
    assert np.all(batch.discount[terminated] == 0.0)


def test_episode_stats_count_real_steps_only() -> None:
    # prepare
    env = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync")
    acc = NStepAccumulator(num_envs=2, obs_shape=(2,), n_step=3, gamma=1.0)
    obs, _ = env.reset(seed=0)
    lengths: list[int] = []
    returns: list[float] = []
    steps = 0

    # act
    for _ in range(30):
        action = np.zeros(2, dtype=np.int64)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        _, stats = acc.push(
            obs=obs,
            action=action,
            reward=reward,
            next_obs=next_obs,
            terminated=terminated,
            truncated=truncated,
        )
        lengths += stats.episode_lengths.tolist()
        returns += stats.episode_returns.tolist()
        steps += stats.env_steps
        obs = next_obs

    # assert: return of an episode of length L is 1 + ... + L; reset steps excluded
    assert lengths
    assert returns == [L * (L + 1) / 2 for L in lengths]
    assert steps < 30 * 2


def test_actor_core_collects_valid_rows_from_a_registered_env() -> None:
    # prepare
    spec = ActorSpec(
        index=0,
        env_id=ENV_ID,
        data=None,
        num_envs=3,
        epsilons=(0.5, 0.1, 0.0),
        seed_entropy=7,
        seed_spawn_key=(0, 0),
        n_step=3,
        gamma=0.99,
        hidden=(8,),
        dueling=True,
        steps_per_slot=4,
    )
    core = ActorCore(spec)

    # act
    got = core.collect(25)
    core.close()

    # assert
    got.batch.validate((2,))
    check_rows(got.batch, n_step=3, gamma=0.99)
    assert len(got.episode_returns) == len(got.episode_lengths) > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"n_step": 0, "gamma": 0.9}, "n_step"), ({"n_step": 3, "gamma": 1.5}, "gamma")],
)
def test_bad_nstep_settings_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NStepAccumulator(num_envs=1, obs_shape=(2,), **kwargs)
