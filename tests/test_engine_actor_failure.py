"""A killed actor is restarted, or the run stops with a clear error; never a hang, never a leak."""

from __future__ import annotations

import os
import signal
import time

import pytest

from fedrl.client.training.actor_pool import ActorFailureError
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from tests.support.segments import record_created, still_there

LEARNER = LearnerConfig(device="cpu", hidden=(16,), batch_size=8, learning_starts=100)


def engine(max_restarts: int) -> TrainingEngine:
    config = EngineConfig(
        workers=1,
        envs_per_worker=4,
        steps_per_slot=4,
        eval_interval=0,
        max_actor_restarts=max_restarts,
        seed=1,
    )
    return TrainingEngine(config, LEARNER)


def wait_for_data(eng: TrainingEngine) -> None:
    start = eng.counters.env_steps
    deadline = time.monotonic() + 120
    while eng.counters.env_steps == start:
        assert time.monotonic() < deadline, "actor produced nothing"
        eng.poll()


def test_a_killed_actor_is_restarted_and_collection_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # prepare
    created = record_created(monkeypatch)
    eng = engine(max_restarts=2)
    with eng:
        wait_for_data(eng)
        (victim,) = eng.actor_pids()

        # act
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while eng.actor_pids() == [victim]:
            assert time.monotonic() < deadline, "dead actor was never replaced"
            eng.poll()
        wait_for_data(eng)

        # assert
        (replacement,) = eng.actor_pids()
        assert replacement != victim
    assert created and still_there(created) == set()


def test_an_actor_dying_past_its_restart_budget_stops_the_run_cleanly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # prepare
    created = record_created(monkeypatch)
    eng = engine(max_restarts=0)

    # act
    with (
        pytest.raises(ActorFailureError, match=r"actor 0 was killed by SIGKILL") as failure,
        eng,
    ):
        wait_for_data(eng)
        os.kill(eng.actor_pids()[0], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            eng.poll()

    # assert
    assert "max_actor_restarts" in str(failure.value)
    assert created and still_there(created) == set()
