"""Federation is lossless for one: adoption applies only what others added, to both networks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.federation.sync_plan import SyncPlan
from fedrl.client.federation.sync_state import InFlight, NamedArrays
from fedrl.client.federation.weight_sync import rebase
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.offline import assert_same_weights, offline_weights
from tests.support.server_harness import InProcessServer, server_config

SMALL = LearnerConfig(
    hidden=(32, 32), learning_starts=64, batch_size=32, target_update_interval=50, device="cpu"
)
ENGINE = EngineConfig(workers=0, envs_per_worker=4, eval_interval=0, seed=3)


def named(*arrays: list[float]) -> NamedArrays:
    return [(f"t{i}", np.array(a, dtype=np.float32)) for i, a in enumerate(arrays)]


def values(arrays: NamedArrays) -> list[list[float]]:
    return [a.tolist() for _, a in arrays]


def test_rebase_keeps_own_later_pushes_and_brings_only_the_others_part() -> None:
    # prepare: base version g0 = [1, 1]; this participant pushed d1 = [0.5, 0] (seq 1)
    # and d2 = [0, 0.25] (seq 2), so its reference is g0 + d1 + d2. The new
    # version holds d1 and another participant's [2, -1], but not yet d2.
    reference = named([1.5, 1.25])
    in_flight = (InFlight(1, named([0.5, 0.0])), InFlight(2, named([0.0, 0.25])))
    version = named([3.5, 0.0])  # g0 + d1 + [2, -1]

    # act
    new_reference, still, change = rebase(reference, in_flight, version, applied_sequence=1)

    # assert: d2 stays in flight and in the reference; the change is the other's [2, -1]
    assert [p.sequence for p in still] == [2]
    assert values(new_reference) == [[3.5, 0.25]]
    assert values(change) == [[2.0, -1.0]]


def test_a_version_of_only_own_pushes_changes_nothing() -> None:
    reference = named([1.5, 1.25], [0.0])
    in_flight = (InFlight(7, named([0.5, 0.25], [-1.0])),)
    version = named([1.5, 1.25], [0.0])  # the base plus exactly the pushed delta

    new_reference, still, change = rebase(reference, in_flight, version, applied_sequence=7)

    assert still == ()
    assert values(new_reference) == values(reference)
    assert values(change) == [[0.0, 0.0], [0.0]]


def test_adopting_others_progress_moves_the_target_by_the_same_change() -> None:
    # prepare: a learner whose target lags its online net
    learner = Learner(obs_shape=(3,), n_actions=2, config=SMALL)
    with torch.no_grad():
        for parameter in learner.target.parameters():
            parameter.add_(0.125)
    online_before = learner.weights()
    target_before = [p.detach().clone().numpy() for p in learner.target.parameters()]
    change = [
        (n, np.full_like(w, 0.5 if i % 2 else -0.25)) for i, (n, w) in enumerate(online_before)
    ]

    # act
    learner.set_weights(
        [(n, w + c) for (n, w), (_, c) in zip(online_before, change, strict=True)],
        target="shift",
    )

    # assert
    online_after = learner.weights()
    target_after = [p.detach().numpy() for p in learner.target.parameters()]
    for (_, before), (_, after), (_, moved) in zip(
        online_before, online_after, change, strict=True
    ):
        np.testing.assert_allclose(after - before, moved, atol=1e-6)
    for before, after, (_, moved) in zip(target_before, target_after, change, strict=True):
        np.testing.assert_allclose(after - before, moved, atol=1e-6)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_lone_federated_participant_trains_exactly_as_it_would_offline(tmp_path: Path) -> None:
    # prepare: the same engine twice (same seeds); one alone, one in a session of
    # its own with K = 1 and float32 deltas, so every push becomes a version it adopts.
    rounds = 60
    expected = offline_weights(ENGINE, SMALL, rounds)

    federated = TrainingEngine(ENGINE, SMALL)
    records: list[dict[str, Any]] = []
    got: list[NamedArrays] = []
    config = server_config(
        tmp_path / "server",
        buffer_size=1,
        global_eval_interval=0,
        # This test pushes after every episode, far above a shared server's default rate.
        push_rate_per_s=1000.0,
        push_burst=1000,
    )
    with InProcessServer(config) as server:
        loop = SyncLoop(
            federated,
            state_dir=tmp_path / "participant",
            participant_id="Макар",
            session="default",
            spec=model_spec(
                "CartPole-v1", federated.weights(), architecture_name(SMALL.hidden, True)
            ),
            channel_factory=lambda: grpc.aio.insecure_channel(server.address),
            share="weights",
            plan=SyncPlan.asynchronous(sync_interval=1, delta_dtype="float32"),
            backoff=BackoffPolicy(base_s=0.1, cap_s=0.5),
            on_record=records.append,
        )
        try:
            loop.start(connect_timeout_s=10.0)
            federated.start()
            # act: each round, let the server make the version of the last push, so
            # adoptions happen all through the run rather than at its end.
            for _ in range(rounds):
                loop.after_poll(federated.poll())
                pushes = sum(r["kind"] == "sync" for r in records)
                settle = time.monotonic() + 5
                while loop.view.version < pushes and time.monotonic() < settle:
                    time.sleep(0.005)
                got.append(federated.weights())
            loop.finish()
        finally:
            loop.close()
            federated.close()
        status = server.stub().Status(pb.StatusRequest(session="default"))

    # assert: many versions were made and adopted, and every round's weights match
    adopted = [r for r in records if r["kind"] == "adopt"]
    assert status.sessions[0].current_version >= 10
    assert len(adopted) >= 10
    assert all(r["change_norm"] < 1e-5 for r in adopted), [r["change_norm"] for r in adopted]
    assert_same_weights(expected, got)
