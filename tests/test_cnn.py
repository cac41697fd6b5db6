"""The Nature CNN: chosen for images, uint8 scaled on the device, rebuilt from its tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrl.client.training.architecture import (
    ArchitectureError,
    build_from_tensors,
    infer_architecture,
)
from fedrl.client.training.cnn import NatureCNN, is_image
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.policy_network import build_actor_critic, ppo_architecture_name
from fedrl.client.training.ppo_learner import PPOConfig, PPOLearner
from fedrl.client.training.q_network import architecture_name, build_q_network, named_arrays
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import EnvShape

STACK = (4, 84, 84)


def test_image_observations_get_the_nature_cnn_and_vectors_the_mlp() -> None:
    q = build_q_network(STACK, 6)
    mlp = build_q_network((8,), 2)

    assert isinstance(q.torso, NatureCNN)
    assert not isinstance(mlp.torso, NatureCNN)
    assert is_image(STACK) and not is_image((4, 10, 10)) and not is_image((84, 84))
    assert architecture_name((256, 256), True, obs_shape=STACK) == "dqn/dueling-cnn-nature"
    assert ppo_architecture_name((64, 64), NetworkConfig(), STACK) == "ppo/cnn-nature"


def test_uint8_frames_are_scaled_on_the_device_exactly_as_floats_would_be() -> None:
    net = build_q_network(STACK, 4).eval()
    frames = torch.randint(0, 256, (3, *STACK), dtype=torch.uint8)

    with torch.no_grad():
        from_uint8 = net(frames)
        from_float = net(frames.float())

    torch.testing.assert_close(from_uint8, from_float)


def test_the_transformer_is_refused_for_images() -> None:
    with pytest.raises(ValueError, match="Nature CNN"):
        build_q_network(STACK, 4, network=NetworkConfig(policy="transformer"))


def test_saved_cnn_networks_are_rebuilt_from_their_tensors() -> None:
    shape = EnvShape(obs_shape=STACK, n_actions=6)
    q = build_q_network(STACK, 6).eval()
    ac = build_actor_critic(STACK, shape, hidden=(64, 64), network=NetworkConfig()).eval()
    frames = torch.randint(0, 256, (2, *STACK), dtype=torch.uint8)

    for net in (q, ac):
        arch = infer_architecture(named_arrays(net))
        rebuilt = build_from_tensors(named_arrays(net), arch.input_shape(), shape)
        assert arch.image_shape == STACK and arch.n_actions == 6
        with torch.no_grad():
            out, again = net(frames), rebuilt(frames)
        for a, b in zip(
            out if isinstance(out, tuple) else (out,),
            again if isinstance(again, tuple) else (again,),
            strict=True,
        ):
            torch.testing.assert_close(a, b)


def test_a_cnn_is_refused_for_observations_it_cannot_read() -> None:
    tensors = named_arrays(build_q_network(STACK, 4))

    with pytest.raises(ArchitectureError, match="images"):
        build_from_tensors(tensors, (3, 84, 84), EnvShape(obs_shape=(3, 84, 84), n_actions=4))
    with pytest.raises(ArchitectureError, match="images"):
        build_from_tensors(tensors, (8,), EnvShape(obs_shape=(8,), n_actions=4))


def test_dqn_and_ppo_learn_from_uint8_frames() -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (68, 84, 84), dtype=np.uint8)
    stacks = np.stack([frames[i : i + 4] for i in range(65)])
    learner = Learner(
        obs_shape=STACK,
        n_actions=4,
        config=LearnerConfig(batch_size=8, learning_starts=32, replay_capacity=200, device="cpu"),
    )
    learner.add(
        LearnerTransitions(
            obs=stacks[:-1],
            action=rng.integers(4, size=64),
            reward=rng.standard_normal(64).astype(np.float32),
            next_obs=stacks[1:],
            discount=np.full(64, 0.99, dtype=np.float32),
        )
    )
    ppo = PPOLearner(
        obs_shape=STACK,
        shape=EnvShape(obs_shape=STACK, n_actions=4),
        config=PPOConfig(rollout_steps=8, epochs=1, minibatch_size=16, device="cpu"),
        network=NetworkConfig(),
    )
    rollout = Rollout(
        obs=stacks[:16].reshape(8, 2, *STACK),
        action=rng.integers(4, size=(8, 2)),
        log_prob=np.full((8, 2), -1.4, dtype=np.float32),
        value=np.zeros((9, 2), dtype=np.float32),
        reward=np.ones((8, 2), dtype=np.float32),
        terminated=np.zeros((8, 2), dtype=np.bool_),
        truncated=np.zeros((8, 2), dtype=np.bool_),
        valid=np.ones((8, 2), dtype=np.bool_),
    )

    dqn_metrics = learner.train(4)
    ppo_metrics = ppo.train(rollout)

    assert np.isfinite(dqn_metrics["loss"]) and np.isfinite(ppo_metrics["loss"])
    with pytest.raises(ValueError, match="dtype float32, expected uint8"):
        learner.add(
            LearnerTransitions(
                obs=stacks[:2].astype(np.float32),
                action=np.zeros(2, dtype=np.int64),
                reward=np.zeros(2, dtype=np.float32),
                next_obs=stacks[1:3].astype(np.float32),
                discount=np.ones(2, dtype=np.float32),
            )
        )
