"""The reference a lossless federation is held to: one engine's weights, round by round."""

from __future__ import annotations

import numpy as np

from fedrl.client.federation.sync_state import NamedArrays
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig


def offline_weights(config: EngineConfig, learner: LearnerConfig, rounds: int) -> list[NamedArrays]:
    """The weights after each of `rounds` rounds of an engine training alone, no server."""
    engine = TrainingEngine(config, learner)
    engine.start()
    try:
        out = []
        for _ in range(rounds):
            engine.poll()
            out.append(engine.weights())
        return out
    finally:
        engine.close()


def assert_same_weights(expected: list[NamedArrays], got: list[NamedArrays]) -> None:
    """Round by round, every tensor within float rounding of the reference's."""
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        for (name, a), (_, b) in zip(want, have, strict=True):
            np.testing.assert_allclose(b, a, atol=1e-5, err_msg=f"round {index}: {name}")
