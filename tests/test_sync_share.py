"""What a participant shares: weights only, experience only, or both; real engines and server."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest

from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.experience_client import KIND
from fedrl.client.federation.outbox import Outbox
from fedrl.client.federation.sync_loop import shares_experience
from fedrl.client.federation.update_entries import UPDATE
from fedrl.client.training.engine import TrainingEngine
from fedrl.common.config_cli import config_from_options
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.experience import Server
from tests.support.participant import participant as shared_participant

# Connecting to a server on loopback takes milliseconds; 5 s is this file's bound.
participant = functools.partial(shared_participant, connect_timeout_s=5.0)


def foreign_rows(engine: TrainingEngine) -> int:
    return engine.foreign_received


def participants_on(server: Server) -> dict[str, pb.ParticipantState]:
    federation, _ = server.stubs()
    status = federation.Status(pb.StatusRequest(session="default"))
    return {p.participant_id: p for p in status.sessions[0].participants}


def test_an_experience_only_participant_shares_transitions_and_keeps_its_own_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records: list[dict[str, Any]] = []
    replaced: list[object] = []
    server = Server(tmp_path / "server").start()
    try:
        with participant(
            server.address, tmp_path / "a", "Макар", "experience", records=records
        ) as (engine, loop):
            monkeypatch.setattr(engine, "set_weights", lambda *a, **k: replaced.append(a))
            while engine.counters.episodes < 6:
                loop.after_poll(engine.poll())
            federation, _ = server.stubs()
            alone = federation.GetVersion(pb.GetVersionRequest(session="default"))
            with participant(server.address, tmp_path / "b", "alice", "both", seed=1) as other:
                deadline = time.monotonic() + 90
                # Until the session has moved past the model alice seeded and
                # each side holds the other's transitions.
                while not (
                    loop.view.version >= 2 and foreign_rows(engine) and foreign_rows(other[0])
                ):
                    assert time.monotonic() < deadline, f"only got to {loop.view}"
                    loop.after_poll(engine.poll())
                    other[1].after_poll(other[0].poll())
                left = [loop.finish(), other[1].finish()]
        on_server = participants_on(server)
    finally:
        server.stop()

    assert alone.current_version == -1, "an experience-only participant seeded the session"
    assert replaced == [] and records == []
    assert loop.base_version == -1
    assert left == [0, 0]
    assert on_server["Макар"].updates_accepted == 0
    assert on_server["Макар"].experience_batches > 0
    assert on_server["alice"].updates_accepted > 0
    assert Outbox(tmp_path / "a" / "outbox").size(UPDATE) == (0, 0)
    assert not (tmp_path / "a" / "state.npz").exists()


def test_a_weights_only_participant_never_calls_the_experience_service(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []
    server = Server(tmp_path / "server").start()
    try:
        # An exchange config is given, and still unused.
        with participant(server.address, tmp_path / "a", "Макар", "weights", records=records) as (
            engine,
            loop,
        ):
            deadline = time.monotonic() + 60
            while not {"sync", "adopt"} <= {r["kind"] for r in records}:
                assert time.monotonic() < deadline, f"records so far: {records}"
                loop.after_poll(engine.poll())
            loop.finish()
        on_server = participants_on(server)
    finally:
        server.stop()

    assert on_server["Макар"].updates_accepted > 0
    assert on_server["Макар"].experience_batches == 0
    assert Outbox(tmp_path / "a" / "outbox").size(KIND) == (0, 0)
    assert not (tmp_path / "a" / "experience_cursor.json").exists()


def test_the_share_decides_whether_experience_is_exchanged() -> None:
    assert shares_experience("both") and shares_experience("experience")
    assert not shares_experience("weights")
    with pytest.raises(ValueError, match="share must be one of"):
        shares_experience("everything")  # type: ignore[arg-type]


def test_the_share_option_reaches_the_config_and_a_ppo_participant_shares_weights_only() -> None:
    config = config_from_options(TrainConfig, {"share": "experience"})
    ppo = TrainConfig(algo="ppo")

    assert config.share == config.effective_share == "experience"
    assert ppo.effective_share == "weights"
    with pytest.raises(ValueError, match="--share"):
        TrainConfig(algo="ppo", share="experience")
