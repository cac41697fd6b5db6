"""The sync loop in one process: real engines (serial mode), a real server on port 0, real files."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.errors import SyncError
from fedrl.client.federation.federation_client import build_update
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.outbox import Outbox
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.federation.sync_plan import SyncPlan
from fedrl.client.federation.sync_state import SyncState, load_sync_state, save_sync_state
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from tests.support.experience import Server as ExperienceServer
from tests.support.ports import free_port
from tests.support.server_harness import InProcessServer, server_config

SMALL = LearnerConfig(hidden=(32, 32), learning_starts=64, batch_size=32, device="cpu")
FAST_RETRY = BackoffPolicy(base_s=0.1, cap_s=0.5)


def make_engine(learner: LearnerConfig = SMALL) -> TrainingEngine:
    return TrainingEngine(
        EngineConfig(workers=0, envs_per_worker=2, eval_interval=500, eval_episodes=3), learner
    )


EVERY_5_EPISODES = SyncPlan.asynchronous(sync_interval=5)


@contextmanager
def participant(
    address: str,
    state_dir: Path,
    participant_id: str,
    *,
    learner: LearnerConfig = SMALL,
    plan: SyncPlan = EVERY_5_EPISODES,
    **loop_options: Any,
) -> Iterator[tuple[TrainingEngine, SyncLoop]]:
    """A started engine and its sync loop (joined if the server answers); both closed after."""
    engine = make_engine(learner)
    spec = model_spec(
        "CartPole-v1", engine.weights(), architecture_name(learner.hidden, learner.dueling)
    )
    loop = SyncLoop(
        engine,
        state_dir=state_dir,
        participant_id=participant_id,
        session="default",
        spec=spec,
        channel_factory=lambda: grpc.aio.insecure_channel(address),
        plan=plan,
        backoff=FAST_RETRY,
        **loop_options,
    )
    try:
        loop.start(connect_timeout_s=3.0)
        engine.start()
        yield engine, loop
    finally:
        loop.close()
        engine.close()


def train_until_goal(*pairs: tuple[TrainingEngine, SyncLoop], limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not all(loop.goal_reached for _, loop in pairs):
        assert time.monotonic() < deadline, "the session goal was not reached in time"
        for engine, loop in pairs:
            if not loop.goal_reached:
                loop.after_poll(engine.poll())


def participants_on_server(server: InProcessServer) -> dict[str, pb.ParticipantState]:
    status = server.stub().Status(pb.StatusRequest(session="default"))
    return {p.participant_id: p for p in status.sessions[0].participants}


def test_two_participants_reach_the_goal_and_their_contributions_add_up(tmp_path: Path) -> None:
    config = server_config(tmp_path / "server", buffer_size=2, goal_episodes=40)
    with (
        InProcessServer(config) as server,
        participant(server.address, tmp_path / "a", "Макар") as first,
        participant(server.address, tmp_path / "b", "alice") as second,
    ):
        train_until_goal(first, second)
        left = [loop.finish() for _, loop in (first, second)]
        local = {"Макар": first[0].counters.episodes, "alice": second[0].counters.episodes}
        on_server = participants_on_server(server)
        goal = server.stub().GetVersion(pb.GetVersionRequest(session="default")).goal

    assert left == [0, 0]
    assert goal.reached
    assert {pid: p.episodes for pid, p in on_server.items()} == local
    assert sum(local.values()) == goal.episodes_done
    assert all(p.updates_accepted > 0 and p.updates_duplicate == 0 for p in on_server.values())


@pytest.mark.parametrize("policy", ["keep", "reset"])
def test_adopting_a_global_model_treats_the_target_network_as_configured(
    tmp_path: Path, policy: str
) -> None:
    adopted: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    with (
        InProcessServer(server_config(tmp_path / "server", buffer_size=1)) as server,
        participant(
            server.address,
            tmp_path / "a",
            "alice",
            plan=SyncPlan.asynchronous(sync_interval=2),
            target_at_adoption=policy,
            on_record=lambda record: record["kind"] == "adopt" and adopted.append(networks()),
        ) as (engine, loop),
    ):

        def networks() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
            learner = engine.learner
            return (
                [p.detach().clone() for p in learner.target.parameters()],
                [p.detach().clone() for p in learner.online.parameters()],
            )

        deadline = time.monotonic() + 60.0
        while len(adopted) < 2:
            assert time.monotonic() < deadline, "no global version was adopted in time"
            result = engine.poll()
            target_before, _ = networks()
            adopted_before = len(adopted)
            loop.after_poll(result)
        loop.finish()

    target, online = adopted[-1]
    # A version made of this participant's own update still moves the online
    # net (bfloat16 deltas), so the two policies leave different targets.
    assert len(adopted) > adopted_before
    if policy == "reset":
        assert all(torch.equal(t, o) for t, o in zip(target, online, strict=True))
    else:
        assert all(torch.equal(t, b) for t, b in zip(target, target_before, strict=True))


@pytest.mark.parametrize("sync_steps", [0, 200])
def test_env_steps_make_a_sync_due_when_episodes_would_not(tmp_path: Path, sync_steps: int) -> None:
    records: list[dict[str, Any]] = []
    with (
        ExperienceServer(tmp_path / "server") as server,
        participant(
            server.address,
            tmp_path / "a",
            "alice",
            plan=SyncPlan.asynchronous(sync_interval=100_000, sync_steps=sync_steps),
            on_record=records.append,
        ) as (engine, loop),
    ):

        def shared() -> bool:
            """Two pushes and an experience batch on the server (pushes keep the server's pace,
            so how many steps that takes depends on the machine's speed)."""
            pushes = sum(r["kind"] == "sync" for r in records)
            return pushes >= 2 and participants_on_server(server)["alice"].experience_batches > 0

        deadline = time.monotonic() + 60.0
        while engine.counters.env_steps < 2_000 or (sync_steps and not shared()):
            assert time.monotonic() < deadline, "the env-step interval never made a sync due"
            loop.after_poll(engine.poll())
        alice = participants_on_server(server)["alice"]
        episodes = engine.counters.episodes

    assert episodes < 100_000
    if sync_steps:
        assert alice.updates_accepted >= 1 and alice.experience_batches >= 1
    else:
        assert [r for r in records if r["kind"] == "sync"] == []
        assert alice.updates_accepted == 0 and alice.experience_batches == 0


def test_sync_loop_refuses_an_unknown_target_policy(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="target_at_adoption must be one of"),
        participant("127.0.0.1:1", tmp_path / "a", "alice", target_at_adoption="drop"),
    ):
        pass


def test_incompatible_model_is_refused_at_start_and_leaves_no_state(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "server")) as server:
        with participant(server.address, tmp_path / "a", "alice"):
            pass
        other = LearnerConfig(hidden=(16,), learning_starts=64, device="cpu")

        with (
            pytest.raises(SyncError, match="differs from session"),
            participant(server.address, tmp_path / "b", "bob", learner=other),
        ):
            pass

    assert not (tmp_path / "b").exists()


def test_participant_trains_while_the_server_is_down_and_joins_when_it_comes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    config = server_config(tmp_path / "server", port=port, goal_episodes=20, buffer_size=1)
    with (
        caplog.at_level(logging.WARNING, logger="fedrl.client.federation.server_link"),
        participant(address, tmp_path / "a", "alice") as pair,
    ):
        engine, loop = pair
        while engine.counters.episodes < 12:
            loop.after_poll(engine.poll())
        offline_episodes = engine.counters.episodes
        assert not loop.view.connected
        with InProcessServer(config) as server:
            train_until_goal(pair)
            loop.finish()
            on_server = participants_on_server(server)

    assert "server unreachable" in caplog.text
    # Everything trained before the server came up was pushed too.
    assert on_server["alice"].episodes == engine.counters.episodes >= offline_episodes


def test_restart_folds_an_update_written_just_before_a_crash(tmp_path: Path) -> None:
    engine = make_engine()
    reference = [(name, np.zeros_like(array)) for name, array in engine.weights()]
    engine.close()
    state_dir = tmp_path / "sync"
    save_sync_state(
        state_dir / "state.npz",
        SyncState(
            base_version=3,
            sequence=0,
            pushed_episodes=10,
            pushed_env_steps=200,
            saved_episodes=10,
            saved_env_steps=200,
            reference=reference,
            local=reference,
        ),
    )
    delta = [(name, np.full_like(array, 0.5)) for name, array in reference]
    # Written to the outbox, then the process died before the state file.
    Outbox(state_dir / "outbox").add(
        "update",
        lambda sequence: [
            m.SerializeToString()
            for m in build_update(
                session="default",
                participant_id="alice",
                sequence=sequence,
                base_version=3,
                env_steps=100,
                episodes=5,
                samples=100,
                metrics=pb.UpdateMetrics(),
                spec_hash="0" * 64,
                delta=delta,
                dtype=tpb.DTYPE_BFLOAT16,
            )
        ],
    )

    engine = make_engine()
    spec = model_spec("CartPole-v1", engine.weights(), architecture_name(SMALL.hidden, True))
    loop = SyncLoop(
        engine,
        state_dir=state_dir,
        participant_id="alice",
        session="default",
        spec=spec,
        channel_factory=lambda: grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}"),
        backoff=FAST_RETRY,
    )
    try:
        assert loop.start(connect_timeout_s=1.0) is None
        restored = load_sync_state(state_dir / "state.npz")
        weights = engine.weights()
        counters = engine.counters
    finally:
        loop.close()
        engine.close()

    assert restored is not None
    assert restored.sequence == 1
    assert (restored.pushed_episodes, restored.pushed_env_steps) == (15, 300)
    for (_, got), (_, local) in zip(restored.reference, weights, strict=True):
        np.testing.assert_array_equal(got, 0.5)
        np.testing.assert_array_equal(local, 0.5)
    assert (counters.episodes, counters.env_steps) == (15, 300)


def test_sync_state_round_trips_and_a_damaged_file_is_refused(tmp_path: Path) -> None:
    arrays = [("w", np.arange(6, dtype=np.float32).reshape(2, 3)), ("b", np.ones(3, np.float32))]
    state = SyncState(4, 7, 30, 600, 33, 660, arrays, [(n, a * 2) for n, a in arrays])
    path = tmp_path / "state.npz"

    save_sync_state(path, state)
    loaded = load_sync_state(path)
    path.write_bytes(path.read_bytes()[:100])

    assert loaded is not None
    assert (loaded.base_version, loaded.sequence, loaded.saved_env_steps) == (4, 7, 660)
    np.testing.assert_array_equal(loaded.local[0][1], arrays[0][1] * 2)
    with pytest.raises(SyncError, match="cannot be read"):
        load_sync_state(path)
    assert load_sync_state(tmp_path / "missing.npz") is None


# Slow: with max staleness 0 and two fast pushers, a version made between a
# participant's adoption and its push makes that push stale; each re-bases as
# soon as it hears of a version (WatchVersions), yet on a loaded machine the
# two can keep refusing each other for a long while.
@pytest.mark.slow
def test_updates_refused_as_stale_go_into_the_next_update_and_nothing_is_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # With max staleness 0, every update based on anything but the newest
    # version is refused: the two participants keep outrunning each other.
    config = server_config(tmp_path / "server", buffer_size=1, goal_episodes=60, max_staleness=0)
    with (
        caplog.at_level(logging.WARNING, logger="fedrl.client.federation.weight_sync"),
        InProcessServer(config) as server,
        participant(server.address, tmp_path / "a", "Макар") as first,
        participant(server.address, tmp_path / "b", "alice") as second,
    ):
        # With no staleness allowed the two participants keep refusing each
        # other's updates until one re-bases in time: slow on a loaded machine.
        train_until_goal(first, second, limit_s=300.0)
        for _, loop in (first, second):
            loop.finish()
        local = {"Макар": first[0].counters.episodes, "alice": second[0].counters.episodes}
        on_server = participants_on_server(server)

    assert "refused as too stale" in caplog.text
    assert {pid: p.episodes for pid, p in on_server.items()} == local
