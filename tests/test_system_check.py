"""`fedrl-client check`: bounded probe, a recommendation from measurements, the server check."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health, health_pb2_grpc

from fedrl.client.commands.check.command import check_command
from fedrl.client.commands.check.config import QUICK_BATCH_SIZES, QUICK_ENV_WIDTHS, CheckConfig
from fedrl.client.commands.check.env_probes import WidthProbe, probe_workers
from fedrl.client.commands.check.learner_probes import UpdateProbe
from fedrl.client.commands.check.recommendation import recommend, recommend_ppo
from fedrl.client.commands.check.server_probe import check_server
from fedrl.client.federation.channel import ConnectionSecurity
from fedrl.client.training.engine_config import available_cores
from fedrl.common.tls import (
    CertifiedKey,
    ParticipantBundle,
    create_ca,
    issue_participant_cert,
    issue_server_cert,
)
from tests.support.ports import free_port
from tests.support.server_harness import InProcessServer, server_config


@pytest.mark.timeout(180)  # a bound, not a timing assertion: the probe must end by itself
def test_quick_check_reports_the_machine_and_prints_a_recommendation() -> None:
    result = CliRunner().invoke(check_command, ["--quick"])

    assert result.exit_code == 0, result.output
    assert "cores" in result.output and "memory" in result.output
    assert "torch 2." in result.output and "grpcio" in result.output
    assert "gpu" in result.output
    recommendation = result.output.split("Recommendation\n", 1)[1]
    assert "fedrl-client --workers" in recommendation
    assert "nothing was changed" in recommendation


@pytest.mark.timeout(180)
def test_quick_check_json_recommends_settings_it_measured() -> None:
    result = CliRunner().invoke(check_command, ["--quick", "--json"])

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    rec = report["recommendation"]
    assert rec["envs_per_worker"] in QUICK_ENV_WIDTHS
    assert rec["batch_size"] in QUICK_BATCH_SIZES
    assert rec["device"] in {u["device"] for u in report["updates"]}
    assert 0 <= rec["workers"] <= max(0, available_cores() - 1)
    assert all(w["actor_steps_per_s"] > 0 for w in report["widths"])
    assert all(u["updates_per_s"] > 0 for u in report["updates"])
    assert report["server"] is None
    # Progress goes to stderr, as plain lines where that is no terminal: stdout stays JSON.
    steps = 1 + 2 * len(QUICK_ENV_WIDTHS) + len(report["updates"])
    progress = result.stderr.splitlines()
    assert progress and all(line.startswith("check done=") for line in progress)
    assert f"done={steps}/{steps}" in progress[-1]


@pytest.mark.timeout(180)
def test_parallel_actor_probe_measures_each_count_with_real_processes() -> None:
    rates = probe_workers("CartPole-v1", (32,), 4, [1], 0.2)

    assert list(rates) == [1]
    assert rates[1] > 0


def widths(*rates: tuple[int, float]) -> list[WidthProbe]:
    return [WidthProbe(envs, rate * 2, 100.0, rate) for envs, rate in rates]


def test_envs_per_worker_is_the_smallest_width_near_the_best() -> None:
    rec = recommend(
        4,
        widths((1, 2_000), (4, 7_000), (16, 25_000), (64, 26_000)),
        {1: 25_000, 3: 70_000},
        [UpdateProbe("cpu", 64, 1e6)],
        replay_ratio=0.5,
    )

    assert rec.envs_per_worker == 16
    assert rec.workers == 3


def test_batch_size_is_the_largest_that_keeps_up_with_collection() -> None:
    updates = [
        UpdateProbe("cpu", 32, 5_000),
        UpdateProbe("cpu", 64, 4_000),
        UpdateProbe("cpu", 128, 2_000),
        UpdateProbe("cpu", 256, 900),
    ]

    rec = recommend(2, widths((16, 3_000)), {1: 3_000}, updates, replay_ratio=0.5)

    assert rec.batch_size == 128  # 2000 updates/s >= 0.5 x 3000 steps/s > 900
    assert any("keeps up" in reason for reason in rec.reasons)


def test_a_learner_bound_machine_gets_fewer_workers() -> None:
    rec = recommend(
        8,
        widths((16, 20_000)),
        {1: 20_000, 3: 58_000, 7: 120_000},
        [UpdateProbe("cpu", 32, 12_000), UpdateProbe("cpu", 64, 9_000)],
        replay_ratio=0.5,
    )

    assert rec.batch_size == 32
    assert rec.workers == 3  # the learner consumes 24k env steps/s; 3 actors make 58k
    assert any("learner sets the pace" in reason for reason in rec.reasons)


def test_cuda_is_chosen_when_its_update_is_faster() -> None:
    updates = [UpdateProbe("cpu", 64, 300), UpdateProbe("cuda", 64, 2_000)]

    rec = recommend(4, widths((16, 5_000)), {1: 5_000}, updates, replay_ratio=0.5)

    assert rec.device == "cuda"


def test_one_core_means_serial_mode() -> None:
    rec = recommend(1, widths((16, 5_000)), {}, [UpdateProbe("cpu", 64, 3_000)], replay_ratio=0.5)

    assert rec.workers == 0
    assert "--workers 0" in rec.command()


# -- the server check ----------------------------------------------------------


@contextmanager
def health_server(ca: CertifiedKey, *, mutual: bool) -> Iterator[str]:
    """A real gRPC server with TLS and the standard health service; yields its target."""
    cert = issue_server_cert(ca, ["127.0.0.1", "localhost"])
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    credentials = grpc.ssl_server_credentials(
        [(cert.key_pem, cert.cert_pem)], root_certificates=ca.cert_pem, require_client_auth=mutual
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.fixture
def tls_health_server() -> Iterator[tuple[str, bytes]]:
    """(target, CA PEM) of a one-way TLS server."""
    ca = create_ca("check test CA")
    with health_server(ca, mutual=False) as target:
        yield target, ca.cert_pem


def test_mutual_tls_server_accepts_the_participant_bundle() -> None:
    ca = create_ca("session CA")
    pair = issue_participant_cert(ca, "Макар")
    bundle = ParticipantBundle(cert_pem=pair.cert_pem, key_pem=pair.key_pem, ca_pem=ca.cert_pem)
    with health_server(ca, mutual=True) as target:
        check = check_server(target, ca_cert=None, insecure=False, bundle=bundle)

    assert check.tls.startswith("verified against the session CA")
    assert check.service == "SERVING"
    assert check.problems == ()


def test_mutual_tls_server_without_a_bundle_gets_a_hint(tmp_path: Path) -> None:
    ca = create_ca("session CA")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    with health_server(ca, mutual=True) as target:
        check = check_server(target, ca_cert=tmp_path / "ca.pem", insecure=False)

    assert check.tls.startswith("verified")  # the server's side is fine
    assert len(check.problems) == 1
    assert "pass --bundle" in check.problems[0]


def test_tls_server_whose_certificate_verifies_is_reported_serving(
    tls_health_server: tuple[str, bytes], tmp_path: Path
) -> None:
    target, ca_pem = tls_health_server
    (tmp_path / "ca.pem").write_bytes(ca_pem)

    check = check_server(target, ca_cert=tmp_path / "ca.pem", insecure=False)

    assert check.reachable
    assert check.tls.startswith("verified against the session CA")
    assert check.service == "SERVING"
    assert check.problems == ()


def test_certificate_from_another_ca_is_reported_as_not_verifying(
    tls_health_server: tuple[str, bytes], tmp_path: Path
) -> None:
    target, _ = tls_health_server
    (tmp_path / "other.pem").write_bytes(create_ca("someone else").cert_pem)

    result = CliRunner().invoke(
        check_command, ["--quick", "--server", target, "--ca-cert", str(tmp_path / "other.pem")]
    )

    assert result.exit_code == 1
    assert "PROBLEM    TLS: certificate does not verify against the session CA" in result.output
    assert "Recommendation" in result.output  # the rest of the check still ran


def test_plaintext_fedrl_server_on_loopback_is_reachable(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data")) as server:
        check = check_server(server.address, ca_cert=None, insecure=False)

    assert check.tls == "plaintext (loopback)"
    assert check.service == "SERVING"
    assert check.problems == ()


def test_server_that_does_not_listen_is_reported_unreachable() -> None:
    check = check_server(f"127.0.0.1:{free_port()}", ca_cert=None, insecure=False, timeout_s=2.0)

    assert not check.reachable
    assert check.problems and "cannot connect" in check.problems[0]


def test_server_without_a_port_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="must be host:port"):
        check_server("fedrl.example.org", ca_cert=None, insecure=False)


def test_contradicting_security_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="contradicts"):
        CheckConfig(tls=ConnectionSecurity(ca_cert=tmp_path / "ca.pem", insecure=True))
    with pytest.raises(ValueError, match="either --bundle or --ca-cert"):
        CheckConfig(tls=ConnectionSecurity(ca_cert=tmp_path / "ca.pem", bundle=tmp_path / "me.pem"))


def ppo_updates(device: str, *rates: tuple[int, float]) -> list[UpdateProbe]:
    return [UpdateProbe(device, size, rate) for size, rate in rates]


def test_ppo_keeps_the_default_minibatch_where_larger_ones_take_longer() -> None:
    # prepare: a CPU, where a 4x larger minibatch takes twice as long per step
    cpu = ppo_updates("cpu", (256, 600.0), (1024, 300.0))

    # act
    rec = recommend_ppo(2, widths((16, 1000.0)), {}, cpu)

    # assert: one actor of 16 envs; 2 minibatches of 256 per update = 32 steps each
    assert (rec.workers, rec.envs_per_worker, rec.batch_size, rec.rollout_steps) == (1, 16, 256, 32)
    assert "--algo ppo" in rec.command() and "--rollout-steps 32" in rec.command()


def test_ppo_takes_larger_minibatches_where_the_device_runs_them_as_fast() -> None:
    # prepare: a GPU whose gradient step costs the same up to 2048 samples
    cpu = ppo_updates("cpu", (256, 600.0), (2048, 100.0))
    cuda = ppo_updates("cuda", (256, 900.0), (1024, 890.0), (2048, 860.0))

    # act
    rec = recommend_ppo(9, widths((64, 5000.0)), {4: 20_000.0, 8: 21_000.0}, cpu + cuda)

    # assert: 4 actors of 64 envs; 2 minibatches of 2048 per update = 16 steps each
    assert (rec.device, rec.batch_size, rec.workers, rec.rollout_steps) == ("cuda", 2048, 4, 16)


@pytest.mark.timeout(180)
def test_quick_ppo_check_on_box_actions_recommends_a_rollout_and_minibatch() -> None:
    result = CliRunner().invoke(check_command, ["--quick", "--algo", "ppo", "--env", "Pendulum-v1"])

    assert result.exit_code == 0, result.output
    recommendation = result.output.split("Recommendation\n", 1)[1]
    assert "fedrl-client --algo ppo" in recommendation
    assert "--rollout-steps" in recommendation and "--minibatch-size" in recommendation
