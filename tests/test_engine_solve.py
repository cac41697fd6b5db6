"""The default engine solves CartPole-v1 for a fixed seed within a step budget."""

from __future__ import annotations

import pytest

from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig

STEP_BUDGET = 60_000


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_defaults_reach_a_greedy_mean_of_475_on_cartpole() -> None:
    # prepare: the command's defaults, on CPU, evaluated every 1000 env steps
    config = EngineConfig(env="CartPole-v1", seed=0, eval_interval=1_000, eval_episodes=10)

    # act
    with TrainingEngine(config, LearnerConfig(device="cpu")) as engine:
        counters = engine.run(lambda c: (c.best_eval or 0.0) >= 475.0 or c.env_steps >= STEP_BUDGET)

    # assert
    assert counters.best_eval is not None and counters.best_eval >= 475.0, counters
