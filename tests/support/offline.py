"""The reference a lossless federation is held to: one engine's weights, round by round."""

from __future__ import annotations

from fedrl.client.federation.sync_state import NamedArrays
from fedrl.client.training.engine import EngineConfig, TrainingEngine
from fedrl.client.training.learner import LearnerConfig


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
