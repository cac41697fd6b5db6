"""The transformer policy: causal, blind to padding, windows per episode, bf16 on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrl.client.training.actor import ActorCore, make_actor_spec
from fedrl.client.training.networks import NetworkConfig, build_torso
from fedrl.client.training.obs_window import ObservationWindow, windowed_shape
from fedrl.client.training.ppo_learner import PPOConfig, PPOLearner
from fedrl.client.training.q_network import architecture_name, build_q_network
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.transformer import CausalTransformer
from fedrl.client.training.vector_env import env_shape, make_vector_env, reset_seeded

NETWORK = NetworkConfig(policy="transformer", context=6, transformer_layers=2, transformer_width=32)


def transformer() -> CausalTransformer:
    torch.manual_seed(0)
    torso, _ = build_torso((6, 4), hidden=(), activation="tanh", network=NETWORK)
    assert isinstance(torso, CausalTransformer)
    return torso.eval()


def full_windows(batch: int = 3) -> torch.Tensor:
    window = torch.randn(batch, 6, 4)
    window[..., -1] = 1.0
    return window


def test_perturbing_a_later_step_leaves_every_earlier_output_unchanged() -> None:
    net = transformer()
    window = full_windows()
    later = window.clone()
    later[:, 4, :-1] += 5.0

    with torch.no_grad():
        before, after = net.encode(window), net.encode(later)

    torch.testing.assert_close(after[:, :4], before[:, :4])
    assert not torch.allclose(after[:, 4], before[:, 4])


def test_padding_before_the_episodes_first_step_is_never_attended_to() -> None:
    # prepare: the first two steps are padding (flag 0), whatever they hold
    net = transformer()
    window = full_windows()
    window[:, :2] = 0.0
    garbage = window.clone()
    garbage[:, :2, :-1] = torch.randn(3, 2, 3) * 10

    with torch.no_grad():
        clean, noisy = net(window.flatten(1)), net(garbage.flatten(1))

    torch.testing.assert_close(noisy, clean)


def test_a_window_starts_again_with_each_episode() -> None:
    window = ObservationWindow(2, (3,), 4)
    window.reset(np.ones((2, 3)))
    window.push(np.full((2, 3), 2.0), starts=np.array([False, False]))

    got = window.push(np.full((2, 3), 3.0), starts=np.array([False, True]))

    assert got.shape == (2, *windowed_shape((3,), 4))
    np.testing.assert_array_equal(got[0, :, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(got[0, :, -1], [0, 1, 1, 1])
    np.testing.assert_array_equal(got[1, :, 0], [0, 0, 0, 3])
    np.testing.assert_array_equal(got[1, :, -1], [0, 0, 0, 1])


def test_a_windowed_env_shows_no_step_of_the_previous_episode_after_an_autoreset() -> None:
    # prepare: pushing CartPole one way ends every episode within ~10 steps
    env = make_vector_env("CartPole-v1", 3, window=16)
    obs = reset_seeded(env, np.random.SeedSequence(0))
    ended = np.zeros(3, dtype=bool)
    while not ended.any():
        obs, _, terminated, truncated, _ = env.step(np.zeros(3, dtype=np.int64))
        ended = terminated | truncated
        # The final observation still belongs to the ending episode's window.
        assert np.all(obs[ended, -2, -1] == 1.0)

    # act: the autoreset step
    obs, *_ = env.step(np.zeros(3, dtype=np.int64))

    # assert
    np.testing.assert_array_equal(obs[ended, :-1], 0.0)
    assert np.all(obs[ended, -1, -1] == 1.0)
    assert np.all(obs[~ended, -2, -1] == 1.0), "other envs keep their history"
    env.close()


def test_a_dqn_actor_acts_on_windows_with_a_transformer_q_network() -> None:
    spec = make_actor_spec(
        0,
        num_actors=1,
        generation=0,
        seed_root=np.random.SeedSequence(1),
        env_id="CartPole-v1",
        num_envs=4,
        exploration_base=0.4,
        exploration_alpha=7.0,
        n_step=3,
        gamma=0.99,
        hidden=(),
        dueling=True,
        steps_per_slot=8,
        network=NETWORK,
    )
    core = ActorCore(spec)

    got = core.collect(8)

    assert got.batch.obs.shape[1:] == (6, 5)
    got.batch.validate((6, 5))
    core.close()


def test_architecture_names_tell_transformers_apart() -> None:
    assert architecture_name((256,), True, NETWORK) == "dqn/dueling-transformer-k6-l2-w32"
    assert architecture_name((256, 256), True) == "dqn/dueling-mlp-256x256"


def test_a_transformer_q_network_takes_flat_or_windowed_batches_alike() -> None:
    torch.manual_seed(0)
    net = build_q_network((6, 5), 2, network=NETWORK).eval()
    windows = full_windows(4)
    windows = torch.cat([windows, torch.ones(4, 6, 1)], dim=2)

    with torch.no_grad():
        torch.testing.assert_close(net(windows), net(windows.flatten(1)))


@pytest.mark.skipif(
    not torch.amp.is_autocast_available("cpu"), reason="this torch has no CPU autocast"
)
def test_a_ppo_update_under_bf16_autocast_on_cpu_stays_finite_and_learns() -> None:
    # prepare: the transformer PPO learner with autocast forced on the CPU
    env = make_vector_env("CartPole-v1", 4, window=6)
    shape = env_shape(env, continuous=True)
    env.close()
    config = PPOConfig(device="cpu", amp="on", epochs=2, minibatch_size=32, rollout_steps=16)
    learner = PPOLearner(obs_shape=shape.obs_shape, shape=shape, config=config, network=NETWORK)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((16, 4, *shape.obs_shape)).astype(np.float32)
    obs[..., -1] = 1.0
    rollout = Rollout(
        obs=obs,
        action=rng.integers(0, 2, (16, 4)),
        log_prob=np.full((16, 4), np.log(0.5), dtype=np.float32),
        value=np.zeros((17, 4), dtype=np.float32),
        reward=np.ones((16, 4), dtype=np.float32),
        terminated=np.zeros((16, 4), dtype=bool),
        truncated=np.zeros((16, 4), dtype=bool),
        valid=np.ones((16, 4), dtype=bool),
    )
    before = [w.copy() for _, w in learner.weights()]

    # act
    with torch.autocast("cpu", dtype=torch.bfloat16):
        probe = learner.net(torch.from_numpy(obs[0]))[0]
    metrics = learner.train(rollout)

    # assert: the autocast forward really ran in bf16, and the update is sound
    assert probe.dtype == torch.bfloat16
    assert all(np.isfinite(v) for v in metrics.values() if isinstance(v, float))
    assert any(not np.allclose(a, w) for a, (_, w) in zip(before, learner.weights(), strict=True))


def test_the_output_is_the_last_positions_features_of_the_full_encoding() -> None:
    net = transformer()
    window = full_windows(5)
    window[:2, :3] = 0.0

    with torch.no_grad():
        torch.testing.assert_close(net(window.flatten(1)), net.encode(window)[:, -1])
