"""Roles: participants that only act feed the session's learners; a new learner can take over."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import main
from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.training.distributed import RankGroup, RankPlace
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.experience import Server
from tests.support.participant import SMALL, participant
from tests.support.ports import free_port


def status_of(server: Server) -> pb.SessionState:
    federation, _ = server.stubs()
    return federation.Status(pb.StatusRequest(session="default")).sessions[0]


def run_until(
    condition: Any, *pairs: tuple[TrainingEngine, SyncLoop], timeout_s: float = 90
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        for engine, loop in pairs:
            loop.after_poll(engine.poll())


def test_an_actor_plays_the_global_model_feeds_the_learner_and_never_trains(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path / "server").start()
    actor_records: list[dict[str, Any]] = []
    try:
        with (
            participant(server.address, tmp_path / "l", "learner", learn=True) as learner,
            participant(
                server.address, tmp_path / "a", "Макар", learn=False, seed=1, records=actor_records
            ) as actor,
        ):
            # act: until the learner trained on the actor's transitions and the actor
            # adopted a version made of the learner's progress
            run_until(
                lambda: learner[0].foreign_received > 0 and actor[1].base_version >= 2,
                learner,
                actor,
            )
            newest = actor[1].base_version
            learner[1].finish()
            actor[1].finish()
            adopted_weights = actor[0].weights()
        status = status_of(server)
    finally:
        server.stop()

    on_server = {p.participant_id: p for p in status.participants}
    assert actor[0].learner.updates == 0 and len(actor[0].learner.replay) == 0
    assert on_server["Макар"].updates_accepted == 0
    assert on_server["Макар"].experience_batches > 0
    assert on_server["learner"].updates_accepted > 0
    assert {r["kind"] for r in actor_records} == {"adopt"}
    assert newest >= 2 and all(np.isfinite(w).all() for _, w in adopted_weights)


def test_a_new_learner_takes_over_from_the_global_model_when_the_learner_leaves(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path / "server").start()
    try:
        with participant(server.address, tmp_path / "a", "actor", learn=False, seed=1) as actor:
            with participant(server.address, tmp_path / "l1", "first", learn=True) as first:
                run_until(lambda: status_of(server).current_version >= 3, first, actor)
                first[1].finish()
            left_at = status_of(server).current_version
            # The session goes on acting with the last global model, learning nothing.
            for _ in range(20):
                actor[1].after_poll(actor[0].poll())
            assert status_of(server).current_version == left_at

            with participant(
                server.address, tmp_path / "l2", "second", learn=True, seed=2
            ) as second:
                # Its first adoption puts it on the global model; from then on it learns
                # from its own and the actor's transitions and makes new versions.
                run_until(lambda: second[1].base_version >= left_at, second, actor)
                took_over = second[0].weights()
                run_until(
                    lambda: (
                        status_of(server).current_version >= left_at + 2
                        and second[0].foreign_received > 0
                    ),
                    second,
                    actor,
                )
                second[1].finish()
            actor[1].finish()
        status = status_of(server)
    finally:
        server.stop()

    on_server = {p.participant_id: p for p in status.participants}
    assert on_server["second"].updates_accepted >= 2
    assert on_server["actor"].updates_accepted == 0
    assert all(np.isfinite(w).all() for _, w in took_over)


def test_the_actor_role_is_for_dqn_and_needs_to_share_both(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--role"):
        TrainConfig(algo="ppo", role="actor")
    engine = TrainingEngine(EngineConfig(workers=0, eval_interval=0), SMALL, learn=False)
    try:
        with pytest.raises(ValueError, match="--share both"):
            SyncLoop(
                engine,
                state_dir=tmp_path,
                participant_id="a",
                session="default",
                spec=model_spec("CartPole-v1", engine.weights(), "x"),
                channel_factory=lambda: grpc.aio.insecure_channel("127.0.0.1:1"),
                share="experience",
            )
    finally:
        engine.close()
    result = CliRunner().invoke(main, ["--role", "actor", "--algo", "ppo", "--offline"])
    assert result.exit_code != 0 and "--role" in result.output


def test_an_actor_is_refused_learner_ranks_and_a_population() -> None:
    ranks = CliRunner().invoke(
        main, ["--participant-id", "a", "--role", "actor", "--learners", "2"]
    )
    population = CliRunner().invoke(
        main, ["--participant-id", "a", "--role", "actor", "--mode", "pbt"]
    )

    assert ranks.exit_code != 0 and "--role actor trains nothing" in ranks.output
    assert "drop --learners, or use --role learner" in ranks.output
    assert population.exit_code != 0 and "every member trains its own weights" in population.output


def test_an_engine_that_only_acts_is_refused_learner_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    place = RankPlace(0, 1, 0, 1, "127.0.0.1", free_port())
    # The group writes torchrun's variables into the environment: undone after the test.
    for key, value in place.env().items():
        monkeypatch.setenv(key, value)
    group = RankGroup(place, "cpu")
    try:
        with pytest.raises(ValueError, match="only acts trains nothing"):
            TrainingEngine(
                EngineConfig(workers=0, eval_interval=0), SMALL, learn=False, ranks=group
            )
    finally:
        group.close()
