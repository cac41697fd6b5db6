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
    pull_donor_learner,
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


def learner(fill: float) -> list[tuple[str, np.ndarray]]:
    """A learner as a member reports it: opaque to the server, its own dtypes."""
    return [
        ("target/w", np.full((4, 3), fill, np.float32)),
        ("position/updates", np.asarray(int(fill * 10), np.int64)),
        ("replay/obs", np.full((5, 2), fill, np.float32)),
        ("replay/action", np.arange(5, dtype=np.int64)),
    ]


def scores_of(federation: object) -> dict[str, float | None]:
    session = federation.Status(fpb.StatusRequest(session="default")).sessions[0]  # type: ignore[attr-defined]
    return {m.participant_id: m.score if m.HasField("score") else None for m in session.members}


def start(data: Path, **overrides: object) -> InProcessServer:
    """A server (started by `with`) that ranks a member READY env steps after its last exploit,
    never resampling."""
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


def test_a_member_is_ranked_on_the_mean_of_its_last_evaluations(tmp_path: Path) -> None:
    with start(tmp_path / "server", pbt_score_window=3) as server:
        federation, population = three_members(server)
        # a: one lucky evaluation after two poor ones; the window's mean is 140
        for sequence, score in enumerate((10.0, 10.0, 400.0), start=1):
            report(
                population, "a", SPEC, weights(1.0), sequence=sequence, env_steps=50, score=score
            )
        report(population, "b", SPEC, weights(2.0), sequence=1, env_steps=50, score=200.0)
        smoothed = scores_of(federation)

        # act: c is ready: between a's mean and b; on a's last evaluation alone it would copy a
        verdict = report(
            population, "c", SPEC, weights(3.0), sequence=1, env_steps=READY, score=150.0
        )
        # a's window slides: its oldest evaluation leaves
        report(population, "a", SPEC, weights(1.0), sequence=4, env_steps=60, score=400.0)
        slid = scores_of(federation)

    assert smoothed["a"] == pytest.approx(140.0) and smoothed["b"] == 200.0
    assert verdict.decision == "keep" and "rank 2 of 3" in verdict.reason
    assert slid["a"] == pytest.approx(270.0)


def test_readiness_counts_own_steps_since_the_last_exploit_and_a_copier_has_no_score(
    tmp_path: Path,
) -> None:
    with start(tmp_path / "server") as server:
        federation, population = three_members(server)
        report(population, "a", SPEC, weights(1.0), sequence=1, env_steps=50, score=400.0)
        report(population, "b", SPEC, weights(2.0), sequence=1, env_steps=50, score=200.0)
        unscored = report(population, "c", SPEC, weights(3.0), sequence=1, env_steps=READY)
        copied = report(
            population, "c", SPEC, weights(3.0), sequence=2, env_steps=READY, score=20.0
        )
        after_copy = scores_of(federation)
        # b is ready: ranked against a alone, not against the score of weights c has left
        b_ranked = report(
            population, "b", SPEC, weights(2.0), sequence=2, env_steps=READY, score=100.0
        )
        adopted = report(
            population, "c", SPEC, weights(1.0), sequence=3, generation=1, env_steps=READY + 50,
            score=500.0,
        )  # fmt: skip
        soon = report(
            population, "c", SPEC, weights(1.0), sequence=4, generation=1, env_steps=2 * READY - 1,
            score=500.0,
        )  # fmt: skip
        ready_again = report(
            population, "c", SPEC, weights(1.0), sequence=5, generation=1, env_steps=2 * READY,
            score=500.0,
        )  # fmt: skip
        ready_still = report(
            population, "c", SPEC, weights(1.0), sequence=6, generation=1, env_steps=2 * READY + 1,
            score=500.0,
        )  # fmt: skip

    assert unscored.decision == "" and copied.decision == "exploit"
    assert after_copy["c"] is None
    assert b_ranked.decision == "exploit" and "rank 2 of 2" in b_ranked.reason
    # c is ranked again only after READY steps of its own since it copied, then at every evaluation
    assert adopted.decision == soon.decision == ""
    assert ready_again.decision == ready_still.decision == "keep"


def test_members_of_different_speeds_are_each_ranked_on_their_own_fresh_evaluations(
    tmp_path: Path,
) -> None:
    with start(tmp_path / "server", pbt_score_window=1) as server:
        federation, population = three_members(server)
        report(population, "b", SPEC, weights(2.0), sequence=1, env_steps=50, score=200.0)
        # a is fast: many reports, ranked at each once it is ready
        fast = [
            report(
                population, "a", SPEC, weights(1.0), sequence=n, env_steps=n * READY // 2,
                score=300.0,
            )
            for n in range(1, 7)
        ]  # fmt: skip
        # c is slow: its first report comes late and ranks it on that evaluation, its own
        slow = report(population, "c", SPEC, weights(3.0), sequence=1, env_steps=READY, score=250.0)
        session = federation.Status(fpb.StatusRequest(session="default")).sessions[0]

    assert [r.decision for r in fast] == ["", "keep", "keep", "keep", "keep", "keep"]
    assert slow.decision == "keep" and "rank 2 of 3" in slow.reason
    rankings = {m.participant_id: m.rankings for m in session.members}
    assert rankings == {"a": 5, "b": 0, "c": 1}


def test_a_report_keeps_its_learner_beside_its_model_for_a_copier_to_pull(tmp_path: Path) -> None:
    data = tmp_path / "server"
    with start(data) as server:
        _, population = three_members(server)
        report(
            population, "a", SPEC, weights(1.0), sequence=1, env_steps=50, score=400.0,
            learner=learner(1.0),
        )  # fmt: skip
        report(population, "b", SPEC, weights(2.0), sequence=1, env_steps=50, score=300.0)
        report(population, "c", SPEC, weights(3.0), sequence=1, env_steps=READY, score=1.0)
        # a moves on: its new report replaces its latest, the donor's stays for c
        report(
            population, "a", SPEC, weights(5.0), sequence=2, env_steps=60, score=450.0,
            learner=learner(5.0),
        )  # fmt: skip
        pulled = pull_donor_learner(population, "c", generation=1)
        kept = sorted(str(p.relative_to(data)) for p in data.rglob("population/**/*.npz"))
        # c adopts: a's first report is needed by no one any more, learner and all
        report(population, "c", SPEC, weights(1.0), sequence=2, generation=1, env_steps=150)
        left = sorted(str(p.relative_to(data)) for p in data.rglob("population/**/*.npz"))
        # b reported no learner: a copy of b takes its model alone
        report(population, "a", SPEC, weights(5.0), sequence=3, env_steps=READY, score=1.0)
        none = pull_donor_learner(population, "a", generation=1)

    assert pulled is not None and [n for n, _ in pulled] == [n for n, _ in learner(1.0)]
    for (_, got), (_, want) in zip(pulled, learner(1.0), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    member = "sessions/default/population"
    assert f"{member}/a/learner/v00000001.npz" in kept
    assert f"{member}/a/learner/v00000002.npz" in kept
    assert [p for p in left if "/a/" in p] == [
        f"{member}/a/learner/v00000002.npz",
        f"{member}/a/v00000002.npz",
    ]
    assert none is None


def test_a_learner_file_without_its_committed_model_is_removed_at_start(tmp_path: Path) -> None:
    data = tmp_path / "server"
    with start(data) as server:
        _, population = three_members(server)
        report(population, "a", SPEC, weights(1.0), sequence=1, score=1.0, learner=learner(1.0))
    learners = data / SESSIONS_DIR / "default" / "population" / "a" / "learner"
    (learners / "v00000002.npz").write_bytes((learners / "v00000001.npz").read_bytes())

    with start(data):
        pass

    assert sorted(p.name for p in learners.iterdir()) == ["v00000001.npz"]
