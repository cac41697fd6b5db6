"""A small CartPole participant (a serial engine and its sync loop) against a real server."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.sync_loop import Share, SyncLoop
from fedrl.client.federation.sync_plan import SyncPlan
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import architecture_name

SMALL = LearnerConfig(hidden=(32, 32), learning_starts=64, batch_size=32, device="cpu")
EXCHANGE = ExchangeConfig(push_transitions=200, pull_transitions=2000)


@contextmanager
def participant(
    address: str,
    state_dir: Path,
    participant_id: str,
    share: Share = "both",
    *,
    learn: bool = True,
    seed: int = 0,
    records: list[dict[str, Any]] | None = None,
    connect_timeout_s: float = 10.0,
    engine_config: EngineConfig | None = None,
    learner: LearnerConfig = SMALL,
    **loop_options: Any,
) -> Iterator[tuple[TrainingEngine, SyncLoop]]:
    """A started engine and its started sync loop, syncing every 3 episodes unless
    `loop_options` say otherwise; closed on exit. `engine_config` (its seed replaced by `seed`):
    default a serial engine of 2 envs."""
    config = engine_config or EngineConfig(workers=0, envs_per_worker=2, eval_interval=0)
    engine = TrainingEngine(dataclasses.replace(config, seed=seed), learner, learn=learn)
    options: dict[str, Any] = {
        "plan": SyncPlan.asynchronous(sync_interval=3),
        "exchange": EXCHANGE,
        **loop_options,
    }
    loop = SyncLoop(
        engine,
        state_dir=state_dir,
        participant_id=participant_id,
        session="default",
        spec=model_spec("CartPole-v1", engine.weights(), architecture_name(learner.hidden, True)),
        channel_factory=lambda: grpc.aio.insecure_channel(address),
        share=share,
        evaluate_global=False,
        backoff=BackoffPolicy(base_s=0.1, cap_s=0.5),
        on_record=None if records is None else records.append,
        **options,
    )
    try:
        loop.start(connect_timeout_s=connect_timeout_s)
        engine.start()
        yield engine, loop
    finally:
        loop.close()
        engine.close()
