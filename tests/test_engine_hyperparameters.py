"""A running engine takes population-based training's new hyperparameters where they live."""

from __future__ import annotations

import dataclasses

import pytest

from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.shm import RingLayout

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ENGINE = EngineConfig(workers=0, envs_per_worker=4, steps_per_slot=4, eval_interval=0)
DQN = LearnerConfig(hidden=(16,), batch_size=16, learning_starts=64, device="cpu")


def test_a_new_replay_ratio_applies_to_env_steps_from_then_on() -> None:
    with TrainingEngine(ENGINE, DQN) as engine:
        engine.run(lambda c: c.env_steps >= 600)
        values = {**engine.hyperparameters(), "replay_ratio": 2.0}
        engine.set_hyperparameters(values)
        steps, updates = engine.counters.env_steps, engine.counters.updates

        engine.run(lambda c: c.env_steps >= steps + 200)

        # 2 updates per env step since the change: not 2 per env step since the start.
        trained, collected = engine.counters.updates - updates, engine.counters.env_steps - steps
        assert 2.0 * (collected - 16) <= trained <= 2.0 * collected
        assert engine.config.replay_ratio == 2.0


def test_a_new_n_step_restarts_actor_processes_on_a_ring_laid_out_for_it() -> None:
    config = dataclasses.replace(ENGINE, workers=1)
    with TrainingEngine(config, DQN) as engine:
        engine.run(lambda c: c.env_steps >= 200)
        pids = engine.actor_pids()
        engine.set_hyperparameters({**engine.hyperparameters(), "n_step": 9.0})
        steps = engine.counters.env_steps

        engine.run(lambda c: c.env_steps >= steps + 400)

        assert engine.config.n_step == 9 and engine.actor_pids() != pids
        ring = engine._schedule.pool.ring
        assert ring is not None and isinstance(ring.layout, RingLayout)
        assert ring.layout == engine.ring_layout(1) and ring.layout.rows_per_slot == 4 * (4 + 8)


def test_ppo_takes_a_new_gae_lambda_entropy_and_clip_range_at_its_next_update() -> None:
    ppo = PPOConfig(rollout_steps=16, epochs=1, minibatch_size=32, device="cpu")
    with TrainingEngine(ENGINE, ppo) as engine:
        engine.run(lambda c: c.env_steps >= 64)
        values = {"lr": 3e-4, "entropy_coef": 0.01, "clip_range": 0.1, "gae_lambda": 0.95}

        engine.set_hyperparameters(values)
        engine.run(lambda c: c.env_steps >= 192)

        assert dict(engine.hyperparameters()) == pytest.approx(values)
        assert engine.learner.optimizer.param_groups[0]["lr"] == pytest.approx(3e-4)
