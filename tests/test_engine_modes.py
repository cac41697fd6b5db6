"""The engine trains the same way in one process and with actor processes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.vector_env import make_vector_env
from tests.support.segments import record_created, still_there

SMALL_LEARNER = LearnerConfig(
    device="cpu", hidden=(32, 32), batch_size=16, learning_starts=200, target_update_interval=50
)


def small_engine(workers: int, **overrides: object) -> TrainingEngine:
    config = EngineConfig(
        workers=workers,
        envs_per_worker=4,
        steps_per_slot=4,
        eval_interval=500,
        eval_episodes=2,
        replay_ratio=0.25,
        seed=3,
        **overrides,  # type: ignore[arg-type]
    )
    return TrainingEngine(config, SMALL_LEARNER)


def test_serial_mode_trains_at_the_configured_replay_ratio() -> None:
    # prepare
    engine = small_engine(0)
    before = [a.copy() for _, a in engine.weights()]

    # act
    with engine:
        engine.run(lambda c: c.env_steps >= 1_200)
        counters = engine.counters

    # assert: credit starts once 200 transitions are in replay (a round of 16
    # steps plus n-step lag later at most); the last round's credit is unspent
    after_ready = counters.env_steps - 200
    assert 0.25 * (after_ready - 2 * 16 - 8) <= counters.updates <= 0.25 * after_ready
    assert counters.episodes > 0 and counters.recent_returns
    assert counters.last_eval is not None and counters.best_eval is not None
    after = [a for _, a in engine.weights()]
    assert any(not np.array_equal(x, y) for x, y in zip(before, after, strict=True))


def test_parallel_mode_with_two_actors_trains_and_frees_its_shared_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # prepare
    created = record_created(monkeypatch)
    engine = small_engine(2)

    # act
    with engine:
        assert len(engine.actor_pids()) == 2
        assert still_there(created), "expected the ring and board in /dev/shm"
        engine.run(lambda c: c.updates >= 100)
        counters = engine.counters

    # assert
    assert counters.env_steps >= 200 and counters.episodes > 0
    assert counters.updates <= 0.25 * counters.env_steps
    assert still_there(created) == set()


def test_adopted_weights_reach_the_learner_and_are_what_it_reports() -> None:
    # prepare
    engine = small_engine(0)
    adopted = [(name, np.full_like(a, 0.01)) for name, a in engine.weights()]

    # act
    with engine:
        engine.set_weights(adopted)
        got = engine.weights()

    # assert
    for (_, want), (_, have) in zip(adopted, got, strict=True):
        np.testing.assert_allclose(have, want)


def test_an_unknown_env_id_fails_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="unknown Gymnasium env id"):
        TrainingEngine(EngineConfig(env="NoSuchEnv-v9", workers=0), SMALL_LEARNER)


def test_an_env_whose_packages_are_missing_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing(*args: object, **kwargs: object) -> None:
        raise gym.error.DependencyNotInstalled("Box2D is not installed")

    monkeypatch.setattr(gym, "make_vec", missing)
    with pytest.raises(ValueError, match=r"LunarLander-v3 .*pip install 'fedrl\[box2d\]'"):
        make_vector_env("LunarLander-v3", 1)


def test_bad_engine_settings_are_refused_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match="envs_per_worker must be at least 1"):
        EngineConfig(envs_per_worker=0)
