"""A population session on a real server (loopback): members, reports, decisions, restarts."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from fedrl.common.status_table import render_status
from fedrl.proto.v1 import federation_pb2 as fpb
from fedrl.server.names import SESSIONS_DIR
from tests.support.population import (
    DQN_VALUES,
    enroll,
    join_population,
    population_stub,
    pull_donor,
    refused,
    report,
)
from tests.support.server_harness import (
    InProcessServer,
    make_spec,
    metadata,
    push,
    server_config,
)

SPEC = make_spec([(4, 3), (3,)])
READY = 100


def weights(fill: float) -> list[np.ndarray]:
    return [np.full((4, 3), fill, np.float32), np.full((3,), -fill, np.float32)]


def start(data: Path, **overrides: object) -> InProcessServer:
    """A server (started by `with`) that ranks members every READY env steps, never resampling."""
    values: dict[str, object] = {"pbt_ready_steps": READY, "pbt_resample_probability": 0.0}
    values.update(overrides)
    return InProcessServer(server_config(data, **values))


def three_members(server: InProcessServer) -> tuple[object, object]:
    federation, population = server.stub(), population_stub(server.address)
    for member in ("a", "b", "c"):
        join_population(federation, member, SPEC)
    enroll(population, "a", {**DQN_VALUES, "lr": 2e-3})
    enroll(population, "b")
    enroll(population, "c", {**DQN_VALUES, "lr": 5e-4})
    return federation, population


def test_the_bottom_member_copies_the_top_members_weights_and_explores_its_hyperparameters(
    tmp_path: Path,
) -> None:
    with start(tmp_path / "server") as server:
        federation, population = three_members(server)
        # Not yet ready (fewer than READY steps): a and b are kept with their scores.
        first_a = report(population, "a", SPEC, weights(1.0), sequence=1, env_steps=50, score=400.0)
        report(population, "b", SPEC, weights(2.0), sequence=1, env_steps=50, score=200.0)

        # act: c is ready and the worst of three
        verdict = report(
            population, "c", SPEC, weights(3.0), sequence=1, env_steps=READY, score=20.0
        )
        donor = pull_donor(population, "c", generation=1)
        adopted = report(
            population, "c", SPEC, weights(1.5), sequence=2, generation=1, env_steps=150
        )
        status = federation.Status(fpb.StatusRequest(session="default"))

    assert first_a.decision == ""
    assert verdict.decision == "exploit", verdict.reason
    assert "rank 3 of 3" in verdict.reason and "copies a" in verdict.reason
    assignment = verdict.assignment
    assert (assignment.generation, assignment.adopt, assignment.donor) == (1, True, "a")
    # Explored from a's hyperparameters: each ×0.8 or ×1.2 (resampling off here).
    assert assignment.hyperparameters["lr"] / 2e-3 == pytest.approx(
        0.8
    ) or assignment.hyperparameters["lr"] / 2e-3 == pytest.approx(1.2)
    assert assignment.hyperparameters["target_update_interval"] in (400.0, 600.0)
    for got, want in zip(donor, weights(1.0), strict=True):
        np.testing.assert_array_equal(got, want)
    assert adopted.assignment.adopt is False and adopted.decision == ""
    session = status.sessions[0]
    assert session.mode == "pbt"
    c = next(m for m in session.members if m.participant_id == "c")
    assert c.generation == 1 and not c.adopting
    lineage = [(g.participant_id, g.generation, g.donor) for g in session.lineage]
    assert lineage == [("a", 0, ""), ("b", 0, ""), ("c", 0, ""), ("c", 1, "a")]
    history = session.lineage[-1]
    assert history.donor_score == 400.0 and history.score == 20.0
    assert dict(history.hyperparameters) == dict(assignment.hyperparameters)
    text = render_status(status)
    assert "population (pbt)" in text and "lineage" in text and "a gen 0" in text


def test_a_member_that_left_is_neither_ranked_nor_copied_until_it_joins_again(
    tmp_path: Path,
) -> None:
    with start(tmp_path / "server") as server:
        federation, population = three_members(server)
        report(population, "a", SPEC, weights(1.0), sequence=1, env_steps=50, score=400.0)
        report(population, "b", SPEC, weights(2.0), sequence=1, env_steps=50, score=200.0)
        federation.Leave(
            fpb.LeaveRequest(session="default", participant_id="a"), metadata=metadata("a")
        )
        without_a = report(
            population, "c", SPEC, weights(3.0), sequence=1, env_steps=READY, score=1.0
        )
        join_population(federation, "a", SPEC)
        back = report(
            population,
            "c",
            SPEC,
            weights(2.0),
            sequence=2,
            generation=1,
            env_steps=2 * READY,
            score=0.5,
        )

    assert without_a.decision == "exploit" and without_a.assignment.donor == "b"
    assert back.decision == "exploit" and back.assignment.donor == "a"


def test_reports_count_toward_the_session_goal_once_each(tmp_path: Path) -> None:
    with start(tmp_path / "server") as server:
        federation, population = three_members(server)
        report(population, "a", SPEC, weights(1.0), sequence=1, env_steps=10, episodes=4)
        again = report(population, "a", SPEC, weights(1.0), sequence=1, env_steps=10, episodes=4)
        report(population, "a", SPEC, weights(1.0), sequence=2, env_steps=30, episodes=7)
        report(population, "b", SPEC, weights(1.0), sequence=1, env_steps=5, episodes=2)
        session = federation.Status(fpb.StatusRequest(session="default")).sessions[0]

    assert again.duplicate
    assert session.goal.episodes_done == 9 and session.env_steps == 35
    assert {p.participant_id: p.episodes for p in session.participants} == {
        "a": 7,
        "b": 2,
        "c": 0,
    }


def test_a_decision_survives_a_restart_and_is_repeated_until_the_member_adopts_it(
    tmp_path: Path,
) -> None:
    data = tmp_path / "server"
    with start(data) as server:
        _, population = three_members(server)
        report(population, "a", SPEC, weights(1.0), sequence=1, env_steps=50, score=400.0)
        report(population, "b", SPEC, weights(2.0), sequence=1, env_steps=50, score=200.0)
        decided = report(
            population, "c", SPEC, weights(3.0), sequence=1, env_steps=READY, score=1.0
        )
        # a moves on: its newer model replaces its latest, but c's donor model stays
        report(population, "a", SPEC, weights(9.0), sequence=2, env_steps=60, score=450.0)

    with start(data) as server:
        population = population_stub(server.address)
        # c restarts, with other hyperparameters on its command line: the server's win
        resumed = enroll(population, "c", {**DQN_VALUES, "lr": 1e-4})
        stale = report(population, "c", SPEC, weights(3.0), sequence=2, env_steps=120, score=1.0)
        donor = pull_donor(population, "c", generation=1)
        report(population, "c", SPEC, weights(1.0), sequence=3, generation=1, env_steps=130)
        files = sorted(
            p.name for p in (data / SESSIONS_DIR).rglob("*.npz") if "population" in str(p)
        )
        with pytest.raises(grpc.RpcError) as gone:
            pull_donor(population, "c", generation=1)

    assert resumed.generation == 1 and resumed.adopt and resumed.donor == "a"
    assert dict(resumed.hyperparameters) == dict(decided.assignment.hyperparameters)
    assert stale.decision == "" and "adopt its assignment first" in stale.reason
    np.testing.assert_array_equal(donor[0], weights(1.0)[0])
    # Once adopted, a's old model is needed by no one: each member keeps its latest only.
    assert files == ["v00000001.npz", "v00000002.npz", "v00000003.npz"]
    assert refused(gone.value)[0] == grpc.StatusCode.NOT_FOUND


def test_a_model_file_written_before_a_kill_and_never_committed_is_removed_at_start(
    tmp_path: Path,
) -> None:
    data = tmp_path / "server"
    with start(data) as server:
        _, population = three_members(server)
        report(population, "a", SPEC, weights(1.0), sequence=1, score=1.0)
    member_dir = data / SESSIONS_DIR / "default" / "population" / "a"
    (member_dir / "v00000002.npz").write_bytes((member_dir / "v00000001.npz").read_bytes())

    with start(data):
        pass

    assert sorted(p.name for p in member_dir.iterdir()) == ["v00000001.npz"]


def test_population_and_averaging_sessions_refuse_each_others_calls(tmp_path: Path) -> None:
    with start(tmp_path / "server") as server:
        federation, population = three_members(server)
        calls = {
            "federated join": lambda: join_population(federation, "d", SPEC, mode="federated"),
            "push": lambda: push(federation, "a", SPEC, weights(0.0), sequence=1, base_version=0),
            "pbt join elsewhere": lambda: (
                join_population(federation, "e", SPEC, session="avg", mode=""),
                join_population(federation, "e", SPEC, session="avg"),
            ),
            "enroll without lr": lambda: enroll(population, "b", {"gamma": 0.99}),
            "report before enrolling": lambda: (
                join_population(federation, "f", SPEC),
                report(population, "f", SPEC, weights(0.0), sequence=1),
            ),
            "generation ahead": lambda: report(
                population, "a", SPEC, weights(0.0), sequence=1, generation=3
            ),
            "wrong shape": lambda: report(
                population,
                "a",
                SPEC,
                [np.zeros((2, 2), np.float32), np.zeros(3, np.float32)],
                sequence=1,
            ),
        }
        outcomes = {}
        for name, call in calls.items():
            with pytest.raises(grpc.RpcError) as error:
                call()
            outcomes[name] = refused(error.value)

    assert outcomes["federated join"][0] == grpc.StatusCode.FAILED_PRECONDITION
    assert "is a population (pbt)" in outcomes["federated join"][1]
    assert outcomes["push"][0] == grpc.StatusCode.FAILED_PRECONDITION
    assert "never push weight deltas" in outcomes["push"][1]
    assert outcomes["pbt join elsewhere"][0] == grpc.StatusCode.FAILED_PRECONDITION
    assert outcomes["enroll without lr"][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "enrolls with lr, replay_ratio, n_step" in outcomes["enroll without lr"][1]
    assert outcomes["report before enrolling"][0] == grpc.StatusCode.FAILED_PRECONDITION
    assert outcomes["generation ahead"][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert outcomes["wrong shape"][0] == grpc.StatusCode.INVALID_ARGUMENT
