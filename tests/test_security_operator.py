"""What an operator runs: init-tls, issue, serve (a real process), revoke; and the new knobs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner, Result

from fedrl.client.federation.channel import open_channel
from fedrl.common.tls import ParticipantBundle
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.cli import main
from fedrl.server.config import ServerConfig
from tests.support.server_harness import ServerProcess, join, make_spec

SPEC = make_spec([(4,)])


def fedrl_server(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


async def join_as(address: str, bundle: ParticipantBundle, pid: str) -> pb.JoinReply:
    async with open_channel(address, bundle=bundle, participant_id=pid) as channel:
        stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
        request = pb.JoinRequest(session="default", participant_id=pid, spec=SPEC)
        return await stub.Join(request, timeout=30)  # type: ignore[no-any-return]


def issued_bundle(data: Path, pid: str, out: Path) -> ParticipantBundle:
    result = fedrl_server(
        "issue", "--data-dir", str(data), "--participant-id", pid, "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    return ParticipantBundle.read(out)


def test_operator_commands_serve_tls_to_an_issued_participant_until_revoked(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    assert fedrl_server("init-tls", "--data-dir", str(data), "--host", "127.0.0.1").exit_code == 0
    bundle = issued_bundle(data, "Макар", tmp_path / "Макар.pem")
    operator = tmp_path / "operator.pem"
    issued_bundle(data, "operator", operator)

    with ServerProcess(data) as server:
        joined = asyncio.run(join_as(server.address, bundle, "Макар"))
        with grpc.insecure_channel(server.address) as plain:
            stub = pb_grpc.FederationStub(plain)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as plaintext:
                join(stub, "Макар", SPEC)
        raised = fedrl_server(
            "raise-goal",
            "--address",
            server.address,
            "--total-episodes",
            "5000",
            "--bundle",
            str(operator),
        )
        revoked = fedrl_server("revoke", "--data-dir", str(data), "--participant-id", "Макар")
        with pytest.raises(grpc.aio.AioRpcError) as after_revoke:
            asyncio.run(join_as(server.address, bundle, "Макар"))

    assert joined.current_version == -1
    assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
    assert raised.exit_code == 0, raised.output
    assert "goal 5000" in raised.output
    assert revoked.exit_code == 0, revoked.output
    assert after_revoke.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_tls_commands_are_part_of_fedrl_server() -> None:
    result = fedrl_server("--help")

    for command in ("init-tls", "issue", "revoke", "serve"):
        assert command in result.output


def test_session_strategy_option_repeats_and_sets_each_session() -> None:
    config = ServerConfig(session_strategy=("robust=trimmed_mean", "a=b=median"))

    assert config.strategy_for("robust") == "trimmed_mean"
    assert config.strategy_for("a=b") == "median"
    assert config.strategy_for("default") == "mean"


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("robust", "SESSION=STRATEGY"),
        ("robust=mode", "SESSION=STRATEGY"),
        ("=median", "session name"),
    ],
)
def test_bad_session_strategy_is_refused_naming_the_entry(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ServerConfig(session_strategy=(entry,))


def test_same_session_given_two_strategies_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        ServerConfig(session_strategy=("s=mean", "s=median"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_update_norm", -1.0),
        ("max_update_norm", float("inf")),
        ("push_burst", 0),
        ("push_rate_per_s", 0.0),
        ("max_streams_per_participant", 0),
        ("stream_idle_timeout_s", -5.0),
    ],
)
def test_bad_limit_is_refused_naming_the_field(field: str, value: float) -> None:
    values: dict[str, Any] = {field: value}

    with pytest.raises(ValueError, match=field):
        ServerConfig(**values)


def test_serve_with_a_bad_session_strategy_is_a_usage_error(tmp_path: Path) -> None:
    result = fedrl_server(
        "serve", "--data-dir", str(tmp_path / "data"), "--session-strategy", "x=mode"
    )

    assert result.exit_code == 2
    assert "x=mode" in result.output


def test_token_auth_without_tls_material_is_refused_at_start(tmp_path: Path) -> None:
    result = fedrl_server("serve", "--data-dir", str(tmp_path / "data"), "--token-auth")

    assert result.exit_code == 2
    assert "init-tls" in result.output
