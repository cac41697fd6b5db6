"""The participant state dir: atomic saves, newest-wins resume, loads that never unpickle code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedrl.client.commands.state_dir import (
    BEST_FILE,
    MODEL_FILE,
    PROGRESS_FILE,
    ModelIdentity,
    StateDir,
    StateError,
)
from fedrl.client.training.counters import Counters

IDENTITY = ModelIdentity(env="CartPole-v1", architecture="dqn/dueling-mlp-8")


def weights(value: float) -> list[tuple[str, np.ndarray]]:
    return [("torso.0.weight", np.full((8, 4), value, np.float32)), ("v", np.full(1, value))]


def test_a_unicode_participant_gets_its_own_directory(tmp_path: Path) -> None:
    # prepare
    state = StateDir(tmp_path, "Макар", IDENTITY)

    # act
    state.save_model(weights(1.0), Counters(episodes=10, env_steps=100))

    # assert
    assert (tmp_path / "Макар" / MODEL_FILE).is_file()
    assert not list((tmp_path / "Макар").glob(".*.tmp"))


def test_an_invalid_participant_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must not contain '/'"):
        StateDir(tmp_path, "a/b", IDENTITY)


def test_a_fresh_participant_has_nothing_to_resume(tmp_path: Path) -> None:
    assert StateDir(tmp_path, "ann", IDENTITY).load() is None


def test_resume_takes_the_newer_model_over_older_progress(tmp_path: Path) -> None:
    # prepare
    state = StateDir(tmp_path, "ann", IDENTITY)
    state.save_progress(Counters(episodes=50, env_steps=500), {"format": 1, "updates": 7})
    state.save_model(weights(2.0), Counters(episodes=60, env_steps=640, best_eval=30.0))

    # act
    resumed = state.load()

    # assert
    assert resumed is not None
    assert resumed.counters.episodes == 60 and resumed.counters.env_steps == 640
    assert resumed.counters.best_eval == 30.0
    assert resumed.learner_state == {"format": 1, "updates": 7}
    assert resumed.weights is not None
    assert [n for n, _ in resumed.weights] == ["torso.0.weight", "v"]
    assert np.all(resumed.weights[0][1] == 2.0)


def test_resume_uses_progress_alone_when_it_is_the_newest(tmp_path: Path) -> None:
    state = StateDir(tmp_path, "ann", IDENTITY)
    state.save_model(weights(2.0), Counters(episodes=50, env_steps=500))
    state.save_progress(Counters(episodes=50, env_steps=500), {"format": 1})

    resumed = state.load()

    assert resumed is not None and resumed.weights is None
    assert resumed.counters.episodes == 50


def test_the_best_model_is_kept_apart_with_its_return(tmp_path: Path) -> None:
    state = StateDir(tmp_path, "ann", IDENTITY)
    state.save_best(weights(3.0), Counters(episodes=5), eval_return=475.0)

    loaded = state.load_best()

    assert loaded is not None
    arrays, eval_return = loaded
    assert eval_return == 475.0 and np.all(arrays[0][1] == 3.0)
    assert (state.path / BEST_FILE).is_file()


def test_a_state_dir_of_another_env_is_refused_with_a_way_out(tmp_path: Path) -> None:
    StateDir(tmp_path, "ann", IDENTITY).save_model(weights(1.0), Counters(episodes=1))
    other = StateDir(tmp_path, "ann", ModelIdentity("Acrobot-v1", IDENTITY.architecture))

    with pytest.raises(StateError, match=r"'CartPole-v1'.*--participant-id or --state-dir"):
        other.load()


def test_a_damaged_file_is_reported_not_half_loaded(tmp_path: Path) -> None:
    state = StateDir(tmp_path, "ann", IDENTITY)
    state.save_model(weights(1.0), Counters(episodes=1))
    path = state.path / MODEL_FILE
    path.write_bytes(path.read_bytes()[:100])

    with pytest.raises(StateError, match="damaged or not a fedrl state file"):
        state.load()


class Payload:
    """An arbitrary class: unpickling it would run code chosen by the file's author."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_a_file_that_needs_unpickling_arbitrary_objects_is_refused(tmp_path: Path) -> None:
    # prepare: a progress file whose learner state hides a pickled callable
    state = StateDir(tmp_path, "ann", IDENTITY)
    state.path.mkdir(parents=True)
    with (state.path / PROGRESS_FILE).open("wb") as f:
        torch.save(
            {
                "format": 1,
                "env": IDENTITY.env,
                "architecture": IDENTITY.architecture,
                "counters": {},
                "learner": Payload(),
            },
            f,
        )

    # act / assert
    with pytest.raises(StateError, match="cannot be loaded"):
        state.load()


def test_metrics_lines_are_appended_as_json(tmp_path: Path) -> None:
    state = StateDir(tmp_path, "ann", IDENTITY)

    state.append_metrics([{"kind": "episode", "return": 1.0}])
    state.append_metrics([{"kind": "eval", "mean": 2.0}])
    state.close()

    lines = (state.path / "metrics.jsonl").read_text().splitlines()
    assert lines == ['{"kind": "episode", "return": 1.0}', '{"kind": "eval", "mean": 2.0}']
