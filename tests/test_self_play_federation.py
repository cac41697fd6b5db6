"""Two-player games in a session: versions join the league, by number too; ratings reach Status."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.experience_client import ExperienceClient
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.league_sync import spread
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.client.training.self_play_config import SelfPlayConfig
from fedrl.common.group_rules import RuleChoices
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.experience import Server as ExperienceServer
from tests.support.server_harness import InProcessServer, join, server_config

pytest.importorskip("pettingzoo")

GAME = "pettingzoo/tictactoe_v3"
LEARNER = LearnerConfig(hidden=(32,), learning_starts=64, batch_size=16, device="cpu")


@contextmanager
def player(address: str, state_dir: Path, pid: str) -> Iterator[tuple[TrainingEngine, SyncLoop]]:
    config = EngineConfig(
        env=GAME,
        workers=0,
        envs_per_worker=2,
        eval_interval=0,
        self_play=SelfPlayConfig(league_versions=3, snapshot_interval=50),
    )
    engine = TrainingEngine(config, LEARNER)
    loop = SyncLoop(
        engine,
        state_dir=state_dir,
        participant_id=pid,
        session="default",
        spec=model_spec(GAME, engine.weights(), architecture_name(LEARNER.hidden, True)),
        channel_factory=lambda: grpc.aio.insecure_channel(address),
        rules=RuleChoices(share="both", sync_interval=3, round_wait_s=0.0, shared_warmup=False),
        exchange=ExchangeConfig(push_transitions=200, pull_transitions=2000),
        evaluate_global=False,
        backoff=BackoffPolicy(base_s=0.1, cap_s=0.5),
    )
    try:
        loop.start(connect_timeout_s=10.0)
        engine.start()
        yield engine, loop
    finally:
        loop.close()
        engine.close()


def test_spread_keeps_the_newest_and_spaces_the_rest() -> None:
    assert spread([5, 1, 3], 8) == [1, 3, 5]
    assert spread(range(100), 3) == [0, 50, 99]  # type: ignore[arg-type]
    assert spread(range(10), 1) == [9]  # type: ignore[arg-type]
    assert spread([], 3) == [] and spread([1, 2], 0) == []


def test_versions_join_the_league_and_ratings_reach_the_session(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "server", keep_last=50)) as server:
        with player(server.address, tmp_path / "ann", "ann") as (ann, ann_loop):
            while (
                server.stub().GetVersion(pb.GetVersionRequest(session="default")).current_version
                < 4
            ):
                ann_loop.after_poll(ann.poll())
            assert ann.self_play is not None
            adopted = ann.self_play.league.versions()
            assert adopted, "adopted versions join the league"
            ann_loop.finish(flush_timeout_s=20)
        newest = server.stub().GetVersion(pb.GetVersionRequest(session="default")).current_version
        with player(server.address, tmp_path / "bob", "Боб") as (bob, bob_loop):
            assert bob.self_play is not None
            deadline = time.monotonic() + 30
            # The history is pulled at join; it joins the league at the next rounds.
            while len(bob.self_play.league.versions()) < 3 and time.monotonic() < deadline:
                bob_loop.after_poll(bob.poll())
            held = bob.self_play.league.versions()
            assert len(held) >= 3 and min(held) < newest
            while bob.counters.episodes < 30:
                bob_loop.after_poll(bob.poll())
            bob_loop.finish(flush_timeout_s=20)
        state = server.stub().Status(pb.StatusRequest(session="default")).sessions[0]
    raters = {r.participant_id for r in state.ratings}
    assert raters == {"ann", "Боб"}
    assert any(r.kind == "latest" for r in state.ratings)
    assert any(v.HasField("rating") for v in state.versions)


def test_shared_experience_records_each_transitions_opponent(tmp_path: Path) -> None:
    with ExperienceServer(tmp_path / "server") as server:
        with player(server.address, tmp_path / "ann", "ann") as (ann, ann_loop):
            while ann.counters.episodes < 40:
                ann_loop.after_poll(ann.poll())
            ann_loop.finish(flush_timeout_s=20)
            spec = model_spec(GAME, ann.weights(), architecture_name(LEARNER.hidden, True))
        assert ann.self_play is not None
        names = {entry.name for entry in ann.self_play.league.entries.values()}
        stub, _ = server.stubs()
        join(stub, "eve", spec)

        async def pull() -> list[tuple[pb.ExperienceHeader, object]]:
            async with grpc.aio.insecure_channel(server.address) as opened:
                client = ExperienceClient(opened, participant_id="eve", session="default")
                return list((await client.pull(0, 10_000)).batches)

        batches = asyncio.run(pull())
    assert batches
    for header, batch in batches:
        assert header.opponents and set(header.opponents) <= names
        assert batch.opponent is not None  # type: ignore[attr-defined]
        assert len(batch.opponent) == header.transitions  # type: ignore[attr-defined]
