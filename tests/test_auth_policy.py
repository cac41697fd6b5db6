"""Transport policy: when plaintext is allowed on either side, and how the refusal reads."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from fedrl.client.federation.channel import ChannelSecurityError, is_loopback_target, open_channel
from fedrl.common.tls import (
    ParticipantBundle,
    TlsMaterialError,
    TlsPaths,
    create_ca,
    issue_server_cert,
    write_private,
)
from fedrl.common.tls import issue_participant_cert as issue
from fedrl.server.security.auth import (
    Authenticator,
    AuthMode,
    InsecureBindError,
    check_bind_policy,
    server_credentials,
    server_transport,
)


def test_plaintext_on_loopback_is_allowed_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_bind_policy("127.0.0.1", tls=False, insecure=False)

    assert caplog.records == []


def test_plaintext_on_every_interface_is_refused_without_insecure() -> None:
    with pytest.raises(InsecureBindError, match=r"init-tls.*--insecure"):
        check_bind_policy("0.0.0.0", tls=False, insecure=False)


def test_insecure_plaintext_on_a_public_address_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check_bind_policy("0.0.0.0", tls=False, insecure=True)

    assert "PLAINTEXT" in caplog.text


def test_tls_is_allowed_on_any_address() -> None:
    check_bind_policy("0.0.0.0", tls=True, insecure=False)


def test_server_serves_mtls_whenever_the_tls_folder_has_material(tmp_path: Path) -> None:
    paths = _init_tls(tmp_path)

    transport = server_transport("0.0.0.0", paths, insecure=True)

    assert transport.authenticator.mode is AuthMode.MTLS
    assert transport.credentials is not None


def test_token_auth_selects_token_mode_over_tls(tmp_path: Path) -> None:
    paths = _init_tls(tmp_path)

    transport = server_transport("0.0.0.0", paths, token_auth=True)

    assert transport.authenticator.mode is AuthMode.TOKEN
    assert transport.credentials is not None


def test_without_material_loopback_serves_plaintext(tmp_path: Path) -> None:
    transport = server_transport("127.0.0.1", TlsPaths.for_data_dir(tmp_path))

    assert transport.authenticator.mode is AuthMode.INSECURE
    assert transport.credentials is None


def test_without_material_a_public_address_needs_insecure(tmp_path: Path) -> None:
    paths = TlsPaths.for_data_dir(tmp_path)

    with pytest.raises(InsecureBindError):
        server_transport("0.0.0.0", paths)
    allowed = server_transport("0.0.0.0", paths, insecure=True)

    assert allowed.authenticator.mode is AuthMode.INSECURE


def test_token_auth_without_material_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TlsMaterialError, match="token authentication needs TLS"):
        server_transport("127.0.0.1", TlsPaths.for_data_dir(tmp_path), token_auth=True)


def _init_tls(data_dir: Path) -> TlsPaths:
    paths = TlsPaths.for_data_dir(data_dir)
    ca = create_ca("CA")
    server = issue_server_cert(ca, ["127.0.0.1"])
    write_private(paths.ca_cert, ca.cert_pem)
    write_private(paths.server_cert, server.cert_pem)
    write_private(paths.server_key, server.key_pem)
    return paths


def test_server_credentials_without_material_say_how_to_create_it(tmp_path: Path) -> None:
    with pytest.raises(TlsMaterialError, match="init-tls"):
        server_credentials(TlsPaths.for_data_dir(tmp_path))


def test_certificate_modes_need_the_tls_folder() -> None:
    with pytest.raises(ValueError, match="TLS folder"):
        Authenticator(mode=AuthMode.MTLS)


def test_client_refuses_plaintext_to_a_remote_host() -> None:
    with pytest.raises(ChannelSecurityError, match="--ca-cert"):
        open_channel("fedrl.example.org:50051")


def test_client_refuses_a_token_without_tls() -> None:
    with pytest.raises(ChannelSecurityError, match="only over TLS"):
        open_channel("127.0.0.1:50051", token="secret")


def test_client_reports_a_missing_or_malformed_ca_certificate(tmp_path: Path) -> None:
    with pytest.raises(TlsMaterialError, match=r"ca\.pem"):
        open_channel("127.0.0.1:50051", ca_cert=tmp_path / "ca.pem")
    with pytest.raises(TlsMaterialError, match="not a PEM certificate"):
        open_channel("127.0.0.1:50051", ca_cert=b"hello")


def test_client_refuses_insecure_together_with_tls_material() -> None:
    ca = create_ca("CA")
    pair = issue(ca, "Макар")
    bundle = ParticipantBundle(cert_pem=pair.cert_pem, key_pem=pair.key_pem, ca_pem=ca.cert_pem)

    with pytest.raises(ChannelSecurityError, match="contradicts"):
        open_channel("10.0.0.5:50051", bundle=bundle, insecure=True)


def test_client_allows_explicit_insecure_to_a_remote_host(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        channel = open_channel("10.0.0.5:50051", insecure=True)
        await channel.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())

    assert "PLAINTEXT" in caplog.text


@pytest.mark.parametrize(
    ("target", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("localhost:50051", True),
        ("[::1]:50051", True),
        ("ipv4:127.0.0.1:50051", True),
        ("dns:///localhost:50051", True),
        ("unix:/tmp/fedrl.sock", True),
        ("10.0.0.5:50051", False),
        ("[2001:db8::1]:50051", False),
        ("fedrl.example.org:50051", False),
        ("dns:///fedrl.example.org:443", False),
    ],
)
def test_loopback_targets_are_recognised(target: str, loopback: bool) -> None:
    assert is_loopback_target(target) is loopback
