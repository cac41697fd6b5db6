"""Global versions are scored off the training path, and the session's best is a scored one."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.global_scoring import GlobalScoring, VersionScore
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.federation.sync_plan import SyncPlan
from fedrl.client.federation.sync_state import NamedArrays
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.evaluation import EvalResult
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.server_harness import InProcessServer, server_config


class FakeScorer:
    """Scores a version by its first tensor's first value; blocks while `gate` is closed."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.scored: list[float] = []
        self.closed = False

    def score(self, weights: NamedArrays) -> EvalResult:
        self.gate.wait(30)
        value = float(weights[0][1].ravel()[0])
        self.scored.append(value)
        return EvalResult(returns=(value,), seconds=0.0)

    def close(self) -> None:
        self.closed = True


def model(value: float) -> NamedArrays:
    return [("w", np.full(2, value, np.float32))]


def test_a_version_is_scored_at_most_once_per_interval_of_own_env_steps() -> None:
    scorer = FakeScorer()
    scoring = GlobalScoring(scorer, interval_env_steps=100)  # type: ignore[arg-type]
    try:
        taken = []
        for version, steps in ((1, 0), (2, 50), (3, 100), (4, 199), (5, 250)):
            taken.append(scoring.offer(version, model(version), env_steps=steps))
            assert scoring.wait_idle(30)
        scores = scoring.take_scores()
    finally:
        scoring.close()

    assert taken == [True, False, True, False, True]
    assert scores == [VersionScore(1, 1.0), VersionScore(3, 3.0), VersionScore(5, 5.0)]
    assert scorer.closed


def test_while_one_version_is_scored_a_newer_offer_replaces_the_waiting_one() -> None:
    scorer = FakeScorer()
    scorer.gate.clear()
    scoring = GlobalScoring(scorer, interval_env_steps=0)  # type: ignore[arg-type]
    try:
        scoring.offer(1, model(1), env_steps=0)
        deadline = time.monotonic() + 30
        while not scoring._busy:  # the first one is being scored
            assert time.monotonic() < deadline
            time.sleep(0.001)
        scoring.offer(2, model(2), env_steps=1)
        scoring.offer(3, model(3), env_steps=2)
        scorer.gate.set()
        assert scoring.wait_idle(30)
        versions = [score.version for score in scoring.take_scores()]
    finally:
        scoring.close()

    assert versions == [1, 3]


def test_a_scoring_failure_leaves_the_version_unscored_and_the_thread_alive() -> None:
    scorer = FakeScorer()
    calls = {"n": 0}
    original = scorer.score

    def flaky(weights: NamedArrays) -> EvalResult:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("env crashed")
        return original(weights)

    scorer.score = flaky  # type: ignore[method-assign]
    scoring = GlobalScoring(scorer, interval_env_steps=0)  # type: ignore[arg-type]
    try:
        scoring.offer(1, model(1), env_steps=0)
        assert scoring.wait_idle(30)
        scoring.offer(2, model(2), env_steps=1)
        assert scoring.wait_idle(30)
        scores = scoring.take_scores()
    finally:
        scoring.close()

    assert scores == [VersionScore(2, 2.0)]


def test_adopted_versions_are_scored_and_the_sessions_best_is_a_scored_one(
    tmp_path: Path,
) -> None:
    # prepare: a participant alone in a session that wants every adopted version scored
    learner = LearnerConfig(hidden=(32, 32), learning_starts=64, batch_size=32, device="cpu")
    engine = TrainingEngine(
        EngineConfig(workers=0, envs_per_worker=4, eval_interval=0, eval_episodes=3), learner
    )
    records: list[dict[str, Any]] = []
    config = server_config(tmp_path / "server", buffer_size=1, global_eval_interval=0)
    with InProcessServer(config) as server:
        loop = SyncLoop(
            engine,
            state_dir=tmp_path / "p",
            participant_id="李雷",
            session="default",
            spec=model_spec("CartPole-v1", engine.weights(), architecture_name((32, 32), True)),
            channel_factory=lambda: grpc.aio.insecure_channel(server.address),
            share="weights",
            plan=SyncPlan.asynchronous(sync_interval=4),
            backoff=BackoffPolicy(base_s=0.1, cap_s=0.5),
            on_record=records.append,
        )
        try:
            loop.start(connect_timeout_s=10.0)
            engine.start()
            # act
            deadline = time.monotonic() + 120
            while sum(r["kind"] == "score" for r in records) < 3:
                assert time.monotonic() < deadline, f"records: {records[-5:]}"
                loop.after_poll(engine.poll())
            loop.finish()
        finally:
            loop.close()
            engine.close()
        status = server.stub().Status(pb.StatusRequest(session="default", max_versions=1000))

    # assert: what was scored reached the server, and its best is one of them
    scored = {r["version"]: r["global_eval"] for r in records if r["kind"] == "score"}
    session = status.sessions[0]
    on_server = {v.version: v.eval_return for v in session.versions if v.HasField("eval_return")}
    assert on_server and set(on_server) <= set(scored)
    assert all(abs(on_server[v] - scored[v]) < 1e-9 for v in on_server)
    assert session.best_version in on_server
    assert session.best_eval_return == max(on_server.values())
