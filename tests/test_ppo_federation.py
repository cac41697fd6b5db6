"""Federated PPO over loopback: one push per rollout update, and no session shared with DQN."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.federation_client import FederationClient, SpecMismatchError
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.federation.sync_plan import SyncPlan
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.policy_network import ppo_architecture_name
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.server_harness import InProcessServer, server_config

PPO = PPOConfig(device="cpu", rollout_steps=32, epochs=2, minibatch_size=64, ppo_hidden=(16,))
ENGINE = EngineConfig(workers=0, envs_per_worker=4, eval_interval=0)


@contextmanager
def ppo_participant(
    address: str, state_dir: Path, participant_id: str, records: list[dict[str, Any]] | None = None
) -> Iterator[tuple[TrainingEngine, SyncLoop]]:
    """A PPO engine federated with the session; `records` collects its metrics records."""
    engine = TrainingEngine(ENGINE, PPO)
    spec = model_spec(
        "CartPole-v1", engine.weights(), ppo_architecture_name(PPO.ppo_hidden, NetworkConfig())
    )
    loop = SyncLoop(
        engine,
        state_dir=state_dir,
        participant_id=participant_id,
        session="default",
        spec=spec,
        channel_factory=lambda: grpc.aio.insecure_channel(address),
        share="weights",
        # PPO pushes per rollout update, not per episodes.
        plan=SyncPlan.asynchronous(sync_interval=1_000),
        backoff=BackoffPolicy(base_s=0.1, cap_s=0.5),
        on_record=records.append if records is not None else None,
    )
    try:
        loop.start(connect_timeout_s=5.0)
        engine.start()
        yield engine, loop
    finally:
        loop.close()
        engine.close()


def test_two_ppo_participants_push_after_every_update_and_reach_the_goal(tmp_path: Path) -> None:
    # prepare
    config = server_config(tmp_path / "server", buffer_size=2, goal_episodes=150)
    records: dict[str, list[dict[str, Any]]] = {"Макар": [], "alice": []}
    with (
        InProcessServer(config) as server,
        ppo_participant(server.address, tmp_path / "a", "Макар", records["Макар"]) as first,
        ppo_participant(server.address, tmp_path / "b", "alice", records["alice"]) as second,
    ):
        updates_seen = {"Макар": 0, "alice": 0}
        deadline = time.monotonic() + 120

        # act
        while not (first[1].goal_reached and second[1].goal_reached):
            assert time.monotonic() < deadline, "the session goal was not reached in time"
            for pid, (engine, loop) in (("Макар", first), ("alice", second)):
                if loop.goal_reached:
                    continue
                result = engine.poll()
                loop.after_poll(result)
                updates_seen[pid] += result.policy_updates
        pushes = {pid: sum(r["kind"] == "sync" for r in recs) for pid, recs in records.items()}
        left = [loop.finish() for _, loop in (first, second)]
        status = server.stub().Status(pb.StatusRequest(session="default")).sessions[0]

    # assert: every push followed an update (one in flight at a time, so not
    # every update leaves on its own); the server took them all
    assert left == [0, 0]
    assert status.goal.reached
    assert status.current_version >= 2
    assert all(0 < pushes[pid] <= updates_seen[pid] for pid in pushes)
    on_server = {p.participant_id: p for p in status.participants}
    assert all(p.updates_accepted > 0 and p.updates_duplicate == 0 for p in on_server.values())
    assert {pid: p.episodes for pid, p in on_server.items()} == {
        "Макар": first[0].counters.episodes,
        "alice": second[0].counters.episodes,
    }


def test_a_ppo_participant_cannot_join_a_dqn_session_and_is_told_why(tmp_path: Path) -> None:
    dqn = TrainingEngine(ENGINE, LearnerConfig(hidden=(16,), device="cpu"))
    ppo = TrainingEngine(ENGINE, PPO)
    dqn_spec = model_spec("CartPole-v1", dqn.weights(), architecture_name((16,), True))
    ppo_spec = model_spec("CartPole-v1", ppo.weights(), "ppo/mlp-16")

    async def join_both(address: str) -> str:
        async with grpc.aio.insecure_channel(address) as channel:
            first = FederationClient(channel, participant_id="dqn", session="default")
            await first.join(dqn_spec)
            await first.seed_model(dqn.weights())
            second = FederationClient(channel, participant_id="ppo", session="default")
            with pytest.raises(SpecMismatchError) as refused:
                await second.join(ppo_spec)
            return str(refused.value)

    with InProcessServer(server_config(tmp_path / "server")) as server:
        message = asyncio.run(join_both(server.address))

    assert "algorithm: session has 'dqn/dueling-mlp-16', yours is 'ppo/mlp-16'" in message
    assert "the session learns with DQN, you with PPO" in message


def test_a_ppo_sync_loop_refuses_experience_exchange(tmp_path: Path) -> None:
    engine = TrainingEngine(ENGINE, PPO)

    with pytest.raises(ValueError, match="off-policy data, which PPO does not learn from"):
        SyncLoop(
            engine,
            state_dir=tmp_path,
            participant_id="a",
            session="default",
            spec=model_spec("CartPole-v1", engine.weights(), "ppo/mlp-16"),
            channel_factory=lambda: grpc.aio.insecure_channel("127.0.0.1:1"),
            share="both",
            exchange=ExchangeConfig(),
        )
