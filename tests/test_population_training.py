"""Population-based training end to end on loopback: three members, one copies a better one.

Three real engines (tiny DQNs on CartPole, serial actors) each drive a
PopulationMember against a real server, in threads of this process so the
test can look inside: the member the server ranks at the bottom must end
up with exactly the donor's model as the server kept it, and with the
donor's hyperparameters each moved ×0.8 or ×1.2 (resampling is off here).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.population import PopulationMember
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.common.hyperparameters import PERTURB_FACTORS, SEARCH_SPACE
from fedrl.proto.v1 import federation_pb2 as fpb
from tests.support.server_harness import InProcessServer, server_config

READY = 600
BUDGET = 8_000
LEARNING_RATES = {"quick": 3e-3, "steady": 1e-3, "slow": 1e-5}


class RecordingMember(PopulationMember):
    """The product's member, keeping what it reported and the donor model it was sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reported: list[list[tuple[str, np.ndarray]]] = []
        self.donors: list[list[tuple[str, np.ndarray]]] = []

    def _snapshot(self, score: float | None) -> Any:
        report = super()._snapshot(score)
        self.reported.append(report.weights)
        return report

    def _take(self, outcome: Any) -> None:
        if outcome.donor is not None:
            self.donors.append(outcome.donor)
        super()._take(outcome)


class Member(threading.Thread):
    """One participant: its engine and its population link, trained until stopped."""

    def __init__(self, name: str, lr: float, address: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.name = name
        self.stop = stop
        self.engine = TrainingEngine(
            EngineConfig(
                workers=0,
                envs_per_worker=4,
                steps_per_slot=4,
                eval_interval=300,
                eval_episodes=3,
                seed=len(name),
            ),
            LearnerConfig(lr=lr, hidden=(32,), batch_size=32, learning_starts=100, device="cpu"),
        )
        spec = model_spec(
            "CartPole-v1", self.engine.weights(), architecture_name((32,), True, NetworkConfig())
        )
        self.member = RecordingMember(
            self.engine,
            participant_id=name,
            session="pop",
            spec=spec,
            channel_factory=lambda: grpc.aio.insecure_channel(address),
        )
        self.adopted: tuple[list[tuple[str, np.ndarray]], dict[str, float]] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.member.start()
            with self.engine:
                while not self.stop.is_set() and self.engine.counters.env_steps < BUDGET:
                    result = self.engine.poll()
                    generation = self.member.generation
                    self.member.after_poll(result)
                    if self.member.generation != generation:
                        # Right after the adoption, before any training step.
                        self.adopted = (self.engine.weights(), dict(self.engine.hyperparameters()))
                        self.stop.set()
                self.member.finish(timeout_s=30.0)
        except BaseException as exc:
            self.error = exc
            self.stop.set()
        finally:
            self.member.close()


def same(a: list[tuple[str, np.ndarray]], b: list[tuple[str, np.ndarray]]) -> bool:
    return [n for n, _ in a] == [n for n, _ in b] and all(
        np.array_equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True)
    )


@pytest.mark.timeout(240)
def test_a_bottom_member_adopts_a_better_members_model_and_perturbed_hyperparameters(
    tmp_path: Path, one_torch_thread: None
) -> None:
    # prepare: three members, one of which barely learns
    config = server_config(tmp_path / "server", pbt_ready_steps=READY, pbt_resample_probability=0.0)
    with InProcessServer(config) as server:
        stop = threading.Event()
        members = {n: Member(n, lr, server.address, stop) for n, lr in LEARNING_RATES.items()}

        # act: they train side by side until one has taken an exploit (or the budget ends)
        for member in members.values():
            member.start()
        for member in members.values():
            member.join(timeout=200)
        status = server.stub().Status(fpb.StatusRequest(session="pop")).sessions[0]

    # assert
    assert all(m.error is None for m in members.values()), [m.error for m in members.values()]
    exploits = [g for g in status.lineage if g.generation > 0]
    assert exploits, "no member was ranked into the bottom within the budget"
    decision = exploits[0]
    copier, donor = members[decision.participant_id], members[decision.donor]
    assert decision.score < decision.donor_score
    assert copier.adopted is not None and copier.member.donors, "the exploit was never taken"
    weights, hyperparameters = copier.adopted
    # The model it adopted is the one the server sent, which the donor had reported.
    assert same(weights, copier.member.donors[0])
    assert any(same(weights, reported) for reported in donor.member.reported)
    # It trains with the server's new hyperparameters: the donor's, each ×0.8 or ×1.2.
    assert hyperparameters == pytest.approx(dict(decision.hyperparameters))
    donor_values = next(
        dict(g.hyperparameters)
        for g in status.lineage
        if (g.participant_id, g.generation) == (decision.donor, decision.donor_generation)
    )
    for name, value in hyperparameters.items():
        moves = {SEARCH_SPACE[name].perturb(donor_values[name], f) for f in PERTURB_FACTORS}
        assert value == pytest.approx(moves.pop()) or value == pytest.approx(moves.pop()), name
    assert len(status.members) == 3
    assert {m.participant_id for m in status.members if m.generation > 0} >= {copier.name}
