"""Experience exchange inside the sync loop and the CLI: real engines, a real server, real files."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt
import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import main
from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.experience_client import KIND
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.outbox import Outbox
from fedrl.client.federation.sync_loop import Share, SyncLoop
from fedrl.client.federation.sync_plan import SyncPlan
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.common.config_cli import config_from_options
from fedrl.common.tls import ParticipantBundle, create_ca, issue_participant_cert
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.experience import Server
from tests.support.server_harness import InProcessServer, join, server_config

SMALL = LearnerConfig(hidden=(32, 32), learning_starts=64, batch_size=32, device="cpu")
EXCHANGE = ExchangeConfig(push_transitions=200, pull_transitions=2000)


def make_engine(seed: int = 0) -> TrainingEngine:
    return TrainingEngine(
        EngineConfig(workers=0, envs_per_worker=2, eval_interval=0, seed=seed), SMALL
    )


@contextmanager
def participant(
    address: str, state_dir: Path, participant_id: str, share: Share, *, seed: int = 0
) -> Iterator[tuple[TrainingEngine, SyncLoop, list[LearnerTransitions]]]:
    """A started engine, its sync loop and every local batch its learner took in."""
    engine = make_engine(seed)
    seen: list[LearnerTransitions] = []
    engine.on_batch(seen.append)
    spec = model_spec("CartPole-v1", engine.weights(), architecture_name(SMALL.hidden, True))
    loop = SyncLoop(
        engine,
        state_dir=state_dir,
        participant_id=participant_id,
        session="default",
        spec=spec,
        channel_factory=lambda: grpc.aio.insecure_channel(address),
        plan=SyncPlan.asynchronous(sync_interval=3),
        evaluate_global=False,
        backoff=BackoffPolicy(base_s=0.1, cap_s=0.5),
        share=share,
        exchange=EXCHANGE,
    )
    try:
        loop.start(connect_timeout_s=5.0)
        engine.start()
        yield engine, loop, seen
    finally:
        loop.close()
        engine.close()


def rows(
    batches: list[LearnerTransitions], mask: npt.NDArray[np.bool_] | None = None
) -> set[bytes]:
    """Transitions as comparable keys (obs and next obs: continuous, so collisions are nil)."""
    return {
        o.tobytes() + n.tobytes()
        for batch in batches
        for o, n, keep in zip(
            batch.obs,
            batch.next_obs,
            np.ones(len(batch), bool) if mask is None else mask,
            strict=True,
        )
        if keep
    }


def test_two_participants_receive_each_others_transitions_tagged_foreign(
    tmp_path: Path, experience_server: Server
) -> None:
    with (
        participant(experience_server.address, tmp_path / "a", "Макар", "both") as first,
        # Other seeds: each one's transitions must be its own to tell them apart.
        participant(experience_server.address, tmp_path / "b", "alice", "both", seed=1) as second,
    ):
        deadline = time.monotonic() + 60
        while not all(engine.foreign_received for engine, _, _ in (first, second)):
            assert time.monotonic() < deadline, "no foreign transitions arrived in time"
            for engine, loop, _ in (first, second):
                loop.after_poll(engine.poll())
        for _, loop, _ in (first, second):
            loop.finish()
        draws = {
            pid: engine.learner.replay.sample(512, beta=0.4)
            for pid, (engine, _, _) in (("Макар", first), ("alice", second))
        }
        local = {"Макар": rows(first[2]), "alice": rows(second[2])}
        spec = model_spec("CartPole-v1", first[0].weights(), architecture_name(SMALL.hidden, True))
    federation, _ = experience_server.stubs()
    status = federation.Status(pb.StatusRequest(session="default"))
    rejoined = join(federation, "alice", spec)

    for pid, other in (("Макар", "alice"), ("alice", "Макар")):
        draw = draws[pid]
        foreign = rows([draw.batch], draw.foreign)
        own = rows([draw.batch], ~draw.foreign)
        assert foreign, f"{pid} drew no foreign transitions"
        assert foreign <= local[other] and not foreign & local[pid]
        assert own <= local[pid]
    counts = {p.participant_id: p for p in status.sessions[0].participants}
    assert all(counts[pid].experience_batches > 0 for pid in ("Макар", "alice"))
    assert all(counts[pid].experience_rejected == 0 for pid in ("Макар", "alice"))
    assert rejoined.last_experience_sequence == counts["alice"].experience_batches
    # Every queued batch, the final one included, was acknowledged.
    assert all(Outbox(tmp_path / d / "outbox").size(KIND) == (0, 0) for d in ("a", "b"))


def test_sharing_weights_only_never_calls_the_experience_service(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A server without the service: any exchange call would log that it is missing.
    with (
        caplog.at_level(logging.WARNING),
        InProcessServer(server_config(tmp_path / "server")) as server,
        participant(server.address, tmp_path / "a", "alice", "weights") as (engine, loop, _),
    ):
        while engine.counters.episodes < 10:
            loop.after_poll(engine.poll())
        loop.finish()

    assert engine.foreign_received == 0
    assert "does not exchange experience" not in caplog.text
    assert not (tmp_path / "a" / "experience_cursor.json").exists()


def test_cli_refuses_a_participant_id_that_is_not_the_bundles(tmp_path: Path) -> None:
    ca = create_ca("test CA")
    pair = issue_participant_cert(ca, "Макар")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(
        ParticipantBundle(cert_pem=pair.cert_pem, key_pem=pair.key_pem, ca_pem=ca.cert_pem).to_pem()
    )

    result = CliRunner().invoke(
        main,
        ["--participant-id", "alice", "--bundle", str(bundle), "--state-dir", str(tmp_path)],
    )

    assert result.exit_code == 2
    assert "differs from 'Макар'" in result.output
    assert not (tmp_path / "alice").exists()


def test_cli_refuses_an_empty_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("\n", encoding="utf-8")

    result = CliRunner().invoke(
        main, ["--episodes", "0", "--server", "127.0.0.1:1", "--token-file", str(token)]
    )

    assert result.exit_code == 2
    assert "is empty" in result.output


def test_exchange_options_reach_the_config() -> None:
    config = config_from_options(
        TrainConfig, {"foreign_credit": 0.5, "pull_transitions": 100, "credit_at_own_pace": False}
    )

    assert config.exchange.foreign_credit == 0.5 and config.exchange.pull_transitions == 100
    assert not config.exchange.credit_at_own_pace
    assert config.exchange.push_transitions == ExchangeConfig().push_transitions


def test_a_negative_foreign_credit_is_refused_before_training() -> None:
    with pytest.raises(ValueError, match="foreign_credit must be >= 0"):
        config_from_options(TrainConfig, {"foreign_credit": -1.0})


def test_every_push_and_adoption_leaves_a_metrics_record(tmp_path: Path) -> None:
    engine = make_engine(0)
    records: list[dict[str, object]] = []
    with InProcessServer(server_config(tmp_path / "server", buffer_size=1)) as server:
        loop = SyncLoop(
            engine,
            state_dir=tmp_path / "a",
            participant_id="Макар",
            session="default",
            spec=model_spec("CartPole-v1", engine.weights(), architecture_name(SMALL.hidden, True)),
            channel_factory=lambda: grpc.aio.insecure_channel(server.address),
            plan=SyncPlan.asynchronous(sync_interval=3),
            evaluate_global=False,
            backoff=BackoffPolicy(base_s=0.1, cap_s=0.5),
            share="weights",
            on_record=records.append,
        )
        try:
            loop.start(connect_timeout_s=5.0)
            engine.start()
            deadline = time.monotonic() + 60
            while not {"sync", "adopt"} <= {r["kind"] for r in records}:
                assert time.monotonic() < deadline, f"records so far: {records}"
                loop.after_poll(engine.poll())
            loop.finish()
        finally:
            loop.close()
            engine.close()

    syncs = [r for r in records if r["kind"] == "sync"]
    adopts = [r for r in records if r["kind"] == "adopt"]
    for record in records:
        assert {"kind", "time", "episode", "env_steps"} <= set(record)
    assert all({"sequence", "base_version", "episodes", "version"} <= set(r) for r in syncs)
    assert all(isinstance(r["version"], int) and r["version"] >= 0 for r in adopts)
