"""The operator commands init-tls, issue and revoke, and their effect on a running server."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner, Result

from fedrl.client.federation.channel import open_channel
from fedrl.common.tls import CertifiedKey, ParticipantBundle, TlsPaths, load_cert
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.security.auth import Authenticator, AuthInterceptor, AuthMode, server_credentials
from fedrl.server.security.tls_commands import init_tls, issue, revoke


def _invoke(command: object, *args: str) -> Result:
    return CliRunner().invoke(command, list(args))  # type: ignore[arg-type]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    result = _invoke(
        init_tls, "--data-dir", str(tmp_path), "--host", "127.0.0.1", "--host", "localhost"
    )
    assert result.exit_code == 0, result.output
    return tmp_path


def test_init_tls_writes_owner_only_material(data_dir: Path) -> None:
    paths = TlsPaths.for_data_dir(data_dir)

    files = [paths.ca_cert, paths.ca_key, paths.server_cert, paths.server_key]

    assert paths.has_server_material()
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    CertifiedKey.read(paths.server_cert, paths.server_key)


def test_init_tls_again_keeps_the_ca_unless_asked_for_a_new_one(data_dir: Path) -> None:
    paths = TlsPaths.for_data_dir(data_dir)
    first_ca = paths.ca_cert.read_bytes()

    again = _invoke(init_tls, "--data-dir", str(data_dir), "--host", "fedrl.example.org")
    kept_ca = paths.ca_cert.read_bytes()
    renewed = _invoke(init_tls, "--data-dir", str(data_dir), "--host", "127.0.0.1", "--new-ca")

    assert again.exit_code == 0 and renewed.exit_code == 0
    assert kept_ca == first_ca
    assert paths.ca_cert.read_bytes() != first_ca
    assert "Keeping the session CA" in again.output


def test_issue_writes_a_unicode_bundle_and_says_what_to_hand_over(data_dir: Path) -> None:
    result = _invoke(issue, "--data-dir", str(data_dir), "--participant-id", "Макар")

    path = TlsPaths.for_data_dir(data_dir).bundles / "Макар.pem"
    assert result.exit_code == 0, result.output
    assert str(path) in result.output
    assert "Hand this one file to Макар" in result.output
    assert ParticipantBundle.read(path).participant_id == "Макар"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_issue_token_prints_it_once_and_stores_only_its_hash(data_dir: Path) -> None:
    result = _invoke(issue, "--data-dir", str(data_dir), "--participant-id", "Макар", "--token")

    token = result.output.splitlines()[1]
    stored = TlsPaths.for_data_dir(data_dir).tokens.read_text(encoding="utf-8")
    assert result.exit_code == 0, result.output
    assert len(token) >= 43
    assert token not in stored
    assert json.loads(stored)["tokens"][0]["participant_id"] == "Макар"


def test_issue_before_init_tls_says_to_run_it(tmp_path: Path) -> None:
    result = _invoke(issue, "--data-dir", str(tmp_path), "--participant-id", "Макар")

    assert result.exit_code == 1
    assert "init-tls" in result.output


def test_issue_refuses_an_id_that_cannot_be_a_file_name(data_dir: Path) -> None:
    result = _invoke(issue, "--data-dir", str(data_dir), "--participant-id", "a/evil")

    assert result.exit_code == 2
    assert "must not contain '/'" in result.output


def test_revoke_of_an_unknown_participant_is_an_error(data_dir: Path) -> None:
    result = _invoke(revoke, "--data-dir", str(data_dir), "--participant-id", "Никто")

    assert result.exit_code == 1
    assert "nothing to revoke" in result.output


def test_revoke_lists_every_certificate_issued_to_the_participant(data_dir: Path) -> None:
    paths = TlsPaths.for_data_dir(data_dir)
    serials = set()
    for _ in range(2):
        _invoke(issue, "--data-dir", str(data_dir), "--participant-id", "Макар")
        bundle = ParticipantBundle.read(paths.bundles / "Макар.pem")
        serials.add(format(load_cert(bundle.cert_pem).serial_number, "x"))
    _invoke(issue, "--data-dir", str(data_dir), "--participant-id", "Иван")

    result = _invoke(revoke, "--data-dir", str(data_dir), "--participant-id", "Макар")

    revoked = json.loads(paths.revoked.read_text(encoding="utf-8"))["revoked"]
    assert result.exit_code == 0, result.output
    assert {r["serial"] for r in revoked} == serials
    assert {r["participant_id"] for r in revoked} == {"Макар"}
    assert not (paths.bundles / "Макар.pem").exists()
    assert (paths.bundles / "Иван.pem").exists()


def test_bundle_from_issue_connects_until_revoke_runs(data_dir: Path) -> None:
    paths = TlsPaths.for_data_dir(data_dir)
    _invoke(issue, "--data-dir", str(data_dir), "--participant-id", "Макар")
    bundle = ParticipantBundle.read(paths.bundles / "Макар.pem")
    auth = Authenticator(mode=AuthMode.MTLS, paths=paths)

    async def scenario() -> tuple[int, grpc.StatusCode]:
        server = grpc.aio.server(interceptors=[AuthInterceptor(auth)])
        pb_grpc.add_FederationServicer_to_server(_Versions(), server)  # type: ignore[no-untyped-call]
        port = server.add_secure_port("127.0.0.1:0", server_credentials(paths))
        await server.start()
        try:
            async with open_channel(
                f"127.0.0.1:{port}", bundle=bundle, participant_id="Макар"
            ) as channel:
                stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
                request = pb.GetVersionRequest(session="s", participant_id="Макар")
                before = await stub.GetVersion(request, timeout=10)
                _invoke(revoke, "--data-dir", str(data_dir), "--participant-id", "Макар")
                with pytest.raises(grpc.aio.AioRpcError) as after:
                    await stub.GetVersion(request, timeout=10)
        finally:
            await server.stop(None)
        return before.current_version, after.value.code()

    version, code = asyncio.run(scenario())

    assert version == 7
    assert code == grpc.StatusCode.UNAUTHENTICATED


class _Versions(pb_grpc.FederationServicer):
    async def GetVersion(self, request: pb.GetVersionRequest, context: object) -> pb.VersionNotice:
        return pb.VersionNotice(session=request.session, current_version=7)
