"""PPO on the training engine: both modes alike, Box actions, resume, and learning (slow)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.ppo_learner import PPOConfig, PPOLearner

SMALL = PPOConfig(device="cpu", rollout_steps=16, epochs=2, minibatch_size=32, ppo_hidden=(16,))


def rounds(engine: TrainingEngine, count: int) -> None:
    assert isinstance(engine.learner, PPOLearner)
    while engine.learner.rounds < count:
        engine.poll(timeout_s=1.0)


def test_one_actor_runs_in_process_and_learns_exactly_what_serial_mode_learns() -> None:
    # prepare: the same seed with workers 0 and 1
    weights = []
    steps = []
    for workers in (0, 1):
        config = EngineConfig(
            env="CartPole-v1", workers=workers, envs_per_worker=4, seed=3, eval_interval=0
        )

        # act
        with TrainingEngine(config, SMALL) as engine:
            rounds(engine, 3)
            weights.append(engine.weights())
            steps.append((engine.counters.env_steps, engine.counters.updates))
            assert engine.actor_pids() == [], "one PPO actor overlaps nothing: no process"

    # assert: 2 epochs x 2 minibatches per update, the same steps and weights
    assert steps[0] == steps[1]
    assert steps[0][1] == 3 * 2 * 2
    for (name, serial), (_, parallel) in zip(*weights, strict=True):
        np.testing.assert_array_equal(serial, parallel, err_msg=name)


def test_two_actor_processes_each_give_a_rollout_to_every_update() -> None:
    config = EngineConfig(env="CartPole-v1", workers=2, envs_per_worker=2, eval_interval=0)

    with TrainingEngine(config, SMALL) as engine:
        assert len(engine.actor_pids()) == 2
        rounds(engine, 3)
        counters = engine.counters

    # 3 updates of 2 actors x 2 envs x 16 steps; each episode's end costs one
    # autoreset step, except where it fell on the last step of the last rollout
    assert 3 * 2 * 2 * 16 <= counters.env_steps + counters.episodes <= 3 * 2 * 2 * 16 + 4


def test_box_actions_train_through_actor_processes() -> None:
    config = EngineConfig(env="Pendulum-v1", workers=2, envs_per_worker=1, eval_interval=0)
    ppo = PPOConfig(device="cpu", rollout_steps=100, epochs=1, minibatch_size=100)

    with TrainingEngine(config, ppo) as engine:
        rounds(engine, 3)
        counters = engine.counters

    # Pendulum's 200-step time limit: 600 env steps end one episode per env.
    assert counters.env_steps == 3 * 100 * 2 - 2
    assert counters.episodes == 2
    assert engine.replay_size is None


def test_dqn_takes_no_box_actions() -> None:
    with pytest.raises(ValueError, match=r"DQN needs a discrete action space.*--algo ppo"):
        TrainingEngine(EngineConfig(env="Pendulum-v1", workers=0), LearnerConfig(device="cpu"))


def test_a_resumed_learner_continues_the_same_schedule_and_minibatch_order() -> None:
    # prepare: one engine collects three rollouts; two learners learn from them,
    # one straight through, one saved and restored into a fresh learner midway
    config = EngineConfig(env="CartPole-v1", workers=0, envs_per_worker=4, eval_interval=0)
    ppo = dataclasses.replace(SMALL, anneal_steps=1_000)
    with TrainingEngine(config, ppo) as engine:
        core = engine._schedule.pool.serial
        assert core is not None
        rollouts = [core.collect().rollout for _ in range(3)]  # type: ignore[union-attr]
    straight, first = (
        PPOLearner(obs_shape=(4,), shape=engine.env_shape, config=ppo, network=engine._network)
        for _ in range(2)
    )
    for rollout in rollouts:
        straight.train(rollout)

    # act
    for rollout in rollouts[:2]:
        first.train(rollout)
    resumed = PPOLearner(
        obs_shape=(4,), shape=engine.env_shape, config=ppo, network=engine._network
    )
    resumed.load_state_dict(first.state_dict())
    resumed.train(rollouts[2])

    # assert
    assert resumed.learning_rate() == straight.learning_rate() < ppo.ppo_lr
    assert (resumed.updates, resumed.rounds, resumed.env_steps) == (
        straight.updates,
        straight.rounds,
        straight.env_steps,
    )
    for (name, a), (_, b) in zip(straight.weights(), resumed.weights(), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_a_dqn_learner_state_is_refused_by_ppo_with_the_reason() -> None:
    config = EngineConfig(env="CartPole-v1", workers=0, eval_interval=0)
    dqn = TrainingEngine(config, LearnerConfig(device="cpu", hidden=(8,)))
    ppo = TrainingEngine(config, SMALL)

    with pytest.raises(ValueError, match="DQN learner's: use --algo dqn"):
        ppo.learner.load_state_dict(dqn.learner.state_dict())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ppo_defaults_reach_a_greedy_mean_of_475_on_cartpole() -> None:
    config = EngineConfig(env="CartPole-v1", seed=0, eval_interval=2_000, eval_episodes=10)

    with TrainingEngine(config, PPOConfig(device="cpu")) as engine:
        counters = engine.run(lambda c: (c.best_eval or 0.0) >= 475.0 or c.env_steps >= 60_000)

    assert counters.best_eval is not None and counters.best_eval >= 475.0, counters


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ppo_swings_pendulum_up_within_the_zoo_step_budget() -> None:
    # prepare: rl-baselines3-zoo's Pendulum-v1 PPO settings, on 4 envs in serial mode
    config = EngineConfig(
        env="Pendulum-v1", workers=0, envs_per_worker=4, seed=0, eval_interval=10_000
    )
    ppo = PPOConfig(
        device="cpu",
        rollout_steps=1024,
        minibatch_size=64,
        epochs=10,
        ppo_lr=1e-3,
        ppo_gamma=0.9,
        gae_lambda=0.95,
    )

    with TrainingEngine(config, ppo) as engine:
        counters = engine.run(lambda c: (c.best_eval or -1e9) >= -200.0 or c.env_steps >= 100_000)

    assert counters.best_eval is not None and counters.best_eval >= -200.0, counters
