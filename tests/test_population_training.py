"""Population-based training end to end on loopback: a member copies a better one's whole learner.

A hand-built population of two real engines (small DQNs on CartPole, serial
actors) driving PopulationMembers against a real server, in threads of this
process so the test can look inside. "ace" holds a hand-set Q-network that
balances the pole (a linear controller: push right when 0.1·x + 0.5·ẋ + θ +
θ̇ > 0, which holds every start of CartPole-v1 for 500 steps) and barely
learns (the smallest learning rate and replay ratio of the search space);
"cub" starts from scratch. Once cub is ready, the server ranks it under ace
and cub must become ace's learner as ace reported it: model, target network,
Adam's state, update count and replay, with ace's hyperparameters each moved
×0.8 or ×1.2 (resampling is off here); and its evaluation right after the
copy, on its own evaluation episodes, must be ace's.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.population import PopulationMember
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.evaluation import EvalResult
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.common.hyperparameters import PERTURB_FACTORS, SEARCH_SPACE
from fedrl.proto.v1 import federation_pb2 as fpb
from fedrl.proto.v1 import population_pb2 as population_pb
from tests.support.server_harness import InProcessServer, server_config

READY = 600
BUDGET = 8_000
HIDDEN = 16
GAINS = np.array([0.1, 0.5, 1.0, 1.0], np.float32)
Named = list[tuple[str, np.ndarray]]


def controller(template: Named) -> Named:
    """The Q-network of the linear controller: A(right) = s, A(left) = −s for s = GAINS·obs,
    through two ReLUs of the torso (relu(s) − relu(−s) = s)."""
    weights = {name: np.zeros_like(array) for name, array in template}
    weights["torso.0.weight"][0], weights["torso.0.weight"][1] = GAINS, -GAINS
    weights["advantage.weight"][0, :2] = (-1.0, 1.0)
    weights["advantage.weight"][1, :2] = (1.0, -1.0)
    return [(name, weights[name]) for name, _ in template]


class RecordingMember(PopulationMember):
    """The product's member, keeping what it reported and the donor it was sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reported: list[Any] = []
        self.donors: list[Any] = []

    def _snapshot(self, score: float | None) -> Any:
        report = super()._snapshot(score)
        self.reported.append(report)
        return report

    def _take(self, outcome: Any) -> None:
        if outcome.donor is not None:
            self.donors.append(outcome.donor)
        super()._take(outcome)


class Member(threading.Thread):
    """One participant: its engine and its population link, trained until stopped."""

    def __init__(
        self, name: str, address: str, stop: threading.Event, **hyperparameters: Any
    ) -> None:
        super().__init__(daemon=True)
        self.name = name
        self.stop = stop
        ratio = hyperparameters.pop("replay_ratio", 0.5)
        self.engine = TrainingEngine(
            EngineConfig(
                workers=0,
                envs_per_worker=4,
                steps_per_slot=4,
                replay_ratio=ratio,
                eval_interval=300,
                eval_episodes=5,
                seed=len(name),
            ),
            LearnerConfig(
                hidden=(HIDDEN,),
                batch_size=32,
                learning_starts=100,
                device="cpu",
                **hyperparameters,
            ),
        )
        spec = model_spec(
            "CartPole-v1",
            self.engine.weights(),
            architecture_name((HIDDEN,), True, NetworkConfig()),
        )
        self.member = RecordingMember(
            self.engine,
            participant_id=name,
            session="pop",
            spec=spec,
            channel_factory=lambda: grpc.aio.insecure_channel(address),
        )
        self.before: float | None = None
        self.after: tuple[dict[str, Any], int, EvalResult, dict[str, float]] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.member.start()
            with self.engine:
                while not self.stop.is_set() and self.engine.counters.env_steps < BUDGET:
                    result = self.engine.poll()
                    generation = self.member.generation
                    self.before = self.engine.counters.last_eval
                    self.member.after_poll(result)
                    if self.member.generation != generation:
                        # Right after the copy, before any training step.
                        self.after = (
                            self.engine.learner.state_dict(),
                            self.engine.replay_size or 0,
                            self.engine.evaluate(),
                            dict(self.engine.hyperparameters()),
                        )
                        self.stop.set()
                self.member.finish(timeout_s=30.0)
        except BaseException as exc:
            self.error = exc
            self.stop.set()
        finally:
            self.member.close()


def same(a: Named, b: Named) -> bool:
    return [n for n, _ in a] == [n for n, _ in b] and all(
        np.array_equal(x, y) for (_, x), (_, y) in zip(a, b, strict=True)
    )


def as_arrays(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {name: t.numpy() for name, t in tensors.items()}


@pytest.mark.timeout(240)
def test_a_member_copies_a_better_members_whole_learner_and_evaluates_as_it_did(
    tmp_path: Path, one_torch_thread: None
) -> None:
    # prepare: a member that balances the pole and hardly learns, and one that starts cold
    config = server_config(tmp_path / "server", pbt_ready_steps=READY, pbt_resample_probability=0.0)
    with InProcessServer(config) as server:
        stop = threading.Event()
        ace = Member("ace", server.address, stop, lr=1e-5, replay_ratio=1 / 16)
        ace.engine.set_weights(controller(ace.engine.weights()), target="reset")
        cub = Member("cub", server.address, stop, lr=1e-3)

        # act: both train until cub has taken an exploit (or the budget ends)
        for member in (ace, cub):
            member.start()
        for member in (ace, cub):
            member.join(timeout=200)
        status = server.stub().Status(fpb.StatusRequest(session="pop")).sessions[0]

    # assert: the decision
    assert ace.error is None and cub.error is None, (ace.error, cub.error)
    (decision,) = [g for g in status.lineage if g.generation > 0]
    assert (decision.participant_id, decision.donor) == ("cub", "ace")
    assert cub.after is not None and cub.member.donors, "the exploit was never taken"
    learner, replay_size, evaluation, hyperparameters = cub.after
    donor = cub.member.donors[0]
    # The model cub took is one ace reported, and with it the learner ace reported then.
    (report,) = [r for r in ace.member.reported if same(r.weights, donor.model)]
    assert donor.learner is not None and same(donor.learner, report.learner)
    reported = dict(report.learner)
    assert same(sorted(as_arrays(learner["online"]).items()), sorted(report.weights))
    target = as_arrays(learner["target"])
    assert all(np.array_equal(target[n], reported[f"target/{n}"]) for n in target)
    for index, entry in learner["optimizer"]["state"].items():
        for key, value in entry.items():
            np.testing.assert_array_equal(value.numpy(), reported[f"optimizer/{index}/{key}"])
    assert learner["updates"] == int(reported["position/updates"]) > 0
    assert replay_size >= len(reported["replay/action"]) > 0
    # Its first evaluation, on its own episodes, is the donor's, far above its own before.
    assert report.score is not None and report.score >= 475.0
    assert abs(evaluation.mean - report.score) <= 25.0, (evaluation.returns, report.score)
    assert cub.before is not None and cub.before < report.score - 100.0
    # It trains with the server's new hyperparameters: ace's, each ×0.8 or ×1.2.
    assert hyperparameters == pytest.approx(dict(decision.hyperparameters))
    donor_values = next(
        dict(g.hyperparameters)
        for g in status.lineage
        if (g.participant_id, g.generation) == (decision.donor, decision.donor_generation)
    )
    for name, value in hyperparameters.items():
        moves = {SEARCH_SPACE[name].perturb(donor_values[name], f) for f in PERTURB_FACTORS}
        assert any(value == pytest.approx(move) for move in moves), name


def test_a_member_reports_its_learner_only_to_a_server_that_keeps_it(
    one_torch_thread: None,
) -> None:
    # prepare: a member whose engine holds some transitions; no server is dialled
    stop = threading.Event()
    member = Member("cub", "127.0.0.1:1", stop, lr=1e-3)
    with member.engine:
        member.engine.run(lambda c: c.env_steps >= 200)
        values = dict(member.engine.hyperparameters())
        old = population_pb.MemberAssignment(hyperparameters=values, replay_transitions=50)
        new = population_pb.MemberAssignment(
            hyperparameters=values, replay_transitions=50, keeps_learner=True
        )

        # act: the assignments of a server without learners, then of one with them
        member.member._apply(old, None, why="")
        without = member.member._snapshot(1.0)
        member.member._apply(new, None, why="")
        with_learner = member.member._snapshot(1.0)
    member.member.close()

    assert without.learner is None
    assert with_learner.learner is not None
    assert len(dict(with_learner.learner)["replay/action"]) == 50
