"""PPO rollouts: the recorder's grid, the actor that fills it, and its shared-memory slot."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.ppo_actor import PPOActorCore, PPOActorSpec
from fedrl.client.training.rollout import Rollout, RolloutRecorder
from fedrl.client.training.shm import RolloutLayout, SlotFill, SlotRing


def step(
    recorder: RolloutRecorder, reward: list[float], ended: list[bool], cut: list[bool]
) -> list:
    n = len(reward)
    stats = recorder.add(
        np.zeros((n, 2), dtype=np.float32),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.float32),
        np.zeros(n, dtype=np.float32),
        np.array(reward),
        np.array(ended),
        np.array(cut),
    )
    return [stats.env_steps, stats.episode_returns.tolist(), stats.episode_lengths.tolist()]


def test_the_step_after_an_episode_ends_is_recorded_as_no_experience() -> None:
    # prepare: env 0 terminates on the second step, env 1 is cut on the fourth
    recorder = RolloutRecorder(num_envs=2, obs_shape=(2,), action_shape=(), steps=4)

    # act
    seen = [
        step(recorder, [1, 1], [False, False], [False, False]),
        step(recorder, [1, 1], [True, False], [False, False]),
        step(recorder, [5, 1], [False, False], [False, False]),  # env 0 autoresets
        step(recorder, [1, 1], [False, False], [False, True]),
    ]
    rollout = recorder.finish(np.zeros(2, dtype=np.float32))

    # assert
    assert seen == [
        [2, [], []],
        [2, [2.0], [2]],
        [1, [], []],
        [2, [4.0], [4]],
    ]
    np.testing.assert_array_equal(rollout.valid[:, 0], [True, True, False, True])
    assert rollout.reward[2, 0] == 0.0, "an autoreset step's reward is no reward"
    np.testing.assert_array_equal(rollout.terminated[:, 0], [False, True, False, False])
    np.testing.assert_array_equal(rollout.truncated[:, 1], [False, False, False, True])


def test_an_episode_ending_on_a_rollouts_last_step_makes_the_next_rollout_start_invalid() -> None:
    recorder = RolloutRecorder(num_envs=1, obs_shape=(2,), action_shape=(), steps=2)
    step(recorder, [1], [False], [False])
    step(recorder, [1], [True], [False])
    recorder.finish(np.zeros(1, dtype=np.float32))

    step(recorder, [0], [False], [False])
    step(recorder, [1], [False], [False])
    rollout = recorder.finish(np.zeros(1, dtype=np.float32))

    np.testing.assert_array_equal(rollout.valid[:, 0], [False, True])


def spec(env_id: str, *, envs: int = 4, steps: int = 32, network: NetworkConfig | None = None):
    return PPOActorSpec(
        index=0,
        env_id=env_id,
        data=None,
        num_envs=envs,
        seed_entropy=7,
        seed_spawn_key=(0, 0),
        steps_per_slot=steps,
        hidden=(16, 16),
        network=network or NetworkConfig(),
    )


def test_the_actor_records_its_own_log_probabilities_and_values() -> None:
    core = PPOActorCore(spec("CartPole-v1"))

    got = core.collect()

    rollout = got.rollout
    rollout.validate((4,), ())
    net = core._net
    with torch.no_grad():
        params, value = net(torch.from_numpy(rollout.obs.reshape(-1, 4)))
        log_prob = net.log_prob(params, torch.from_numpy(rollout.action.reshape(-1)))
    np.testing.assert_allclose(log_prob.numpy(), rollout.log_prob.reshape(-1), rtol=1e-5)
    np.testing.assert_allclose(value.numpy(), rollout.value[:-1].reshape(-1), rtol=1e-5)
    assert got.env_steps == int(rollout.valid.sum())
    core.close()


def test_an_autoreset_step_acts_on_the_final_observation_so_its_value_is_the_bootstrap() -> None:
    # CartPole with a near-uniform policy ends episodes within ~30 steps.
    core = PPOActorCore(spec("CartPole-v1", steps=64))

    rollout = core.collect().rollout

    t, e = np.nonzero(rollout.terminated[:-1])
    assert len(t) > 0
    assert not rollout.valid[t + 1, e].any()
    final = rollout.obs[t + 1, e]
    # A terminated CartPole episode's last state is past a cart or pole limit.
    assert np.all((np.abs(final[:, 0]) > 2.4) | (np.abs(final[:, 2]) > 0.2095))
    core.close()


def test_box_actions_are_stored_unclipped_and_time_limits_are_truncations() -> None:
    core = PPOActorCore(spec("Pendulum-v1", envs=2, steps=210))

    rollout = core.collect().rollout

    assert rollout.action.shape == (210, 2, 1) and rollout.action.dtype == np.float32
    assert np.abs(rollout.action).max() > 2.0, "samples beyond the bounds are kept as drawn"
    np.testing.assert_array_equal(np.nonzero(rollout.truncated[:, 0])[0], [199])
    assert not rollout.terminated.any()
    assert not rollout.valid[200].any()
    core.close()


def test_a_rollout_written_through_one_attachment_reads_back_through_another() -> None:
    # prepare
    layout = RolloutLayout(num_slots=2, steps=5, envs=3, obs_shape=(4,), action_shape=(2,))
    owner = SlotRing(layout)
    attached = SlotRing(layout, name=owner.name)
    rng = np.random.default_rng(0)
    sent = Rollout(
        obs=rng.standard_normal((5, 3, 4)).astype(np.float32),
        action=rng.standard_normal((5, 3, 2)).astype(np.float32),
        log_prob=rng.standard_normal((5, 3)).astype(np.float32),
        value=rng.standard_normal((6, 3)).astype(np.float32),
        reward=rng.standard_normal((5, 3)).astype(np.float32),
        terminated=rng.random((5, 3)) < 0.2,
        truncated=rng.random((5, 3)) < 0.2,
        valid=rng.random((5, 3)) < 0.8,
    )

    # act
    attached.slots[1].write(sent, np.array([1.5]), np.array([7]))
    got, returns, lengths = owner.slots[1].read(SlotFill(slot=1, rows=15, episodes=1, env_steps=9))

    # assert
    for name in ("obs", "action", "log_prob", "value", "reward", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(got, name), getattr(sent, name))
    np.testing.assert_array_equal(got.valid, sent.valid)
    assert returns.tolist() == [1.5] and lengths.tolist() == [7]
    attached.close()
    owner.close()


def test_a_rollout_of_another_shape_is_refused_by_the_slot() -> None:
    ring = SlotRing(RolloutLayout(num_slots=1, steps=2, envs=1, obs_shape=(4,), action_shape=()))
    recorder = RolloutRecorder(num_envs=2, obs_shape=(4,), action_shape=(), steps=2)
    for _ in range(2):
        recorder.add(
            np.zeros((2, 4), np.float32),
            np.zeros(2, np.int64),
            np.zeros(2, np.float32),
            np.zeros(2, np.float32),
            np.zeros(2),
            np.zeros(2, bool),
            np.zeros(2, bool),
        )

    with pytest.raises(ValueError, match="rollout obs has shape"):
        ring.slots[0].write(recorder.finish(np.zeros(2, np.float32)), np.zeros(0), np.zeros(0))
    ring.close()
