"""Authentication over real TLS on 127.0.0.1: handshakes, identity, revocation, tokens.

Every test starts a real grpc.aio server with the Authenticator and
AuthInterceptor in front of a tiny Federation servicer that answers with the
caller's authenticated id, and dials it with fedrl.client.federation.channel.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedrl.client.federation.channel import open_channel, participant_metadata
from fedrl.common.tls import (
    CertifiedKey,
    ParticipantBundle,
    TlsPaths,
    create_ca,
    issue_participant_cert,
    issue_server_cert,
    write_private,
)
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.refusals import RequestRefusedError
from fedrl.server.security.auth import (
    HEALTH_METHODS,
    Authenticator,
    AuthInterceptor,
    AuthMode,
    issue_token,
    record_issued,
    revoke,
    server_credentials,
)
from fedrl.server.transport.call_context import abort, acting_as

TIMEOUT_S = 10


class _EchoFederation(pb_grpc.FederationServicer):
    """Answers with the id the caller is authenticated as (in VersionNotice.session).

    The id a request names is checked as the real servicers check it.
    """

    def __init__(self, auth: Authenticator) -> None:
        self._auth = auth

    async def GetVersion(self, request: pb.GetVersionRequest, context: Any) -> pb.VersionNotice:
        pid = await self._auth.authenticate(context)
        try:
            acting_as(context, request.participant_id)
        except RequestRefusedError as exc:
            await abort(context, exc)
        return pb.VersionNotice(session=pid)

    async def PushUpdate(
        self, requests: AsyncIterator[pb.UpdateChunk], context: Any
    ) -> pb.PushReply:
        return pb.PushReply(sequence=len([r async for r in requests]))

    async def WatchVersions(
        self, request: pb.GetVersionRequest, context: Any
    ) -> AsyncIterator[pb.VersionNotice]:
        for version in range(2):
            yield pb.VersionNotice(session=request.session, current_version=version)


@asynccontextmanager
async def _serving(auth: Authenticator, credentials: Any | None) -> AsyncIterator[str]:
    server = grpc.aio.server(interceptors=[AuthInterceptor(auth, exempt=HEALTH_METHODS)])
    pb_grpc.add_FederationServicer_to_server(_EchoFederation(auth), server)  # type: ignore[no-untyped-call]
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def _pki(tmp_path: Path) -> tuple[TlsPaths, CertifiedKey]:
    paths = TlsPaths.for_data_dir(tmp_path)
    ca = create_ca("test session CA")
    server = issue_server_cert(ca, ["127.0.0.1", "localhost"])
    write_private(paths.ca_cert, ca.cert_pem)
    write_private(paths.ca_key, ca.key_pem)
    write_private(paths.server_cert, server.cert_pem)
    write_private(paths.server_key, server.key_pem)
    return paths, ca


def _bundle(paths: TlsPaths, ca: CertifiedKey, pid: str, **kwargs: Any) -> ParticipantBundle:
    pair = issue_participant_cert(ca, pid, **kwargs)
    record_issued(paths, pid, pair.cert_pem)
    return ParticipantBundle(cert_pem=pair.cert_pem, key_pem=pair.key_pem, ca_pem=ca.cert_pem)


def _stub(channel: grpc.aio.Channel) -> Any:
    return pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]


async def _get_version(channel: grpc.aio.Channel, pid: str, **kwargs: Any) -> str:
    stub = _stub(channel)
    reply = await stub.GetVersion(
        pb.GetVersionRequest(session="s", participant_id=pid), timeout=TIMEOUT_S, **kwargs
    )
    return str(reply.session)


async def _status_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


def _run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


@pytest.fixture
def mtls(tmp_path: Path) -> tuple[TlsPaths, CertifiedKey, Authenticator]:
    paths, ca = _pki(tmp_path)
    return paths, ca, Authenticator(mode=AuthMode.MTLS, paths=paths)


# --------------------------------------------------------------------------
# Mutual TLS


def test_unicode_participant_is_identified_from_its_certificate(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle, participant_id="Макар") as channel,
        ):
            # The same name typed decomposed (NFD) is the same participant.
            nfd = unicodedata.normalize("NFD", "Макар")
            got = await _get_version(channel, nfd, metadata=participant_metadata("Макар"))
        assert got == "Макар"

    _run(scenario)


def test_plaintext_client_to_tls_server_is_unavailable(mtls: Any) -> None:
    paths, _, auth = mtls

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target) as channel,
        ):
            code, _ = await _status_of(_get_version(channel, "Макар"))
        assert code == grpc.StatusCode.UNAVAILABLE

    _run(scenario)


def test_certificate_from_a_foreign_ca_is_rejected(mtls: Any, tmp_path: Path) -> None:
    paths, ca, auth = mtls
    foreign_ca = create_ca("someone else's CA")
    pair = issue_participant_cert(foreign_ca, "Макар")
    # Trusts our CA for the server, but presents a certificate our CA never signed.
    intruder = ParticipantBundle(
        cert_pem=pair.cert_pem, key_pem=pair.key_pem, ca_pem=foreign_ca.cert_pem
    )

    async def scenario() -> None:
        async with _serving(auth, server_credentials(paths)) as target:
            creds = grpc.ssl_channel_credentials(ca.cert_pem, intruder.key_pem, intruder.cert_pem)
            async with grpc.aio.secure_channel(target, creds) as channel:
                code, _ = await _status_of(_get_version(channel, "Макар"))
        assert code == grpc.StatusCode.UNAVAILABLE

    _run(scenario)


def test_expired_certificate_is_rejected(mtls: Any) -> None:
    paths, ca, auth = mtls
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    expired = _bundle(paths, ca, "Макар", days=1, now=long_ago)

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=expired, participant_id="Макар") as channel,
        ):
            code, _ = await _status_of(_get_version(channel, "Макар"))
        assert code == grpc.StatusCode.UNAVAILABLE

    _run(scenario)


def test_client_without_certificate_is_rejected_in_mtls_mode(mtls: Any) -> None:
    paths, ca, auth = mtls

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, ca_cert=ca.cert_pem) as channel,
        ):
            code, _ = await _status_of(_get_version(channel, "Макар"))
        assert code == grpc.StatusCode.UNAVAILABLE

    _run(scenario)


def test_client_refuses_server_whose_certificate_names_another_host(tmp_path: Path) -> None:
    paths, ca = _pki(tmp_path)
    other = issue_server_cert(ca, ["fedrl.example.org"])
    write_private(paths.server_cert, other.cert_pem)
    write_private(paths.server_key, other.key_pem)
    auth = Authenticator(mode=AuthMode.MTLS, paths=paths)
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle, participant_id="Макар") as channel,
        ):
            code, _ = await _status_of(_get_version(channel, "Макар"))
        assert code == grpc.StatusCode.UNAVAILABLE

    _run(scenario)


def test_client_streaming_calls_name_their_participant_too(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def chunks() -> AsyncIterator[pb.UpdateChunk]:
        for _ in range(2):
            yield pb.UpdateChunk(header=pb.UpdateHeader(participant_id="Макар"))

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle, participant_id="Макар") as channel,
        ):
            reply = await _stub(channel).PushUpdate(chunks(), timeout=TIMEOUT_S)
        assert reply.sequence == 2

    _run(scenario)


def test_revoked_participant_is_refused_on_its_next_call_without_restart(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with _serving(auth, server_credentials(paths)) as target:
            async with open_channel(target, bundle=bundle, participant_id="Макар") as channel:
                before = await _get_version(channel, "Макар")
                revoke(paths, "Макар")
                # Same open connection: the check is per call, not per handshake.
                code, details = await _status_of(_get_version(channel, "Макар"))
            reissued = _bundle(paths, ca, "Макар")
            async with open_channel(target, bundle=reissued, participant_id="Макар") as channel:
                after = await _get_version(channel, "Макар")
        assert before == "Макар"
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in details
        assert after == "Макар"

    _run(scenario)


def test_revocation_also_stops_streaming_calls(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle, participant_id="Макар") as channel,
        ):
            stub = _stub(channel)
            request = pb.GetVersionRequest(session="s", participant_id="Макар")
            before = [n async for n in stub.WatchVersions(request, timeout=TIMEOUT_S)]
            revoke(paths, "Макар")
            code, _ = await _status_of(_drain(stub.WatchVersions(request, timeout=TIMEOUT_S)))
        assert [n.current_version for n in before] == [0, 1]
        assert code == grpc.StatusCode.UNAUTHENTICATED

    _run(scenario)


async def _drain(call: Any) -> list[Any]:
    return [message async for message in call]


def test_request_naming_another_participant_is_permission_denied(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle, participant_id="Макар") as channel,
        ):
            code, details = await _status_of(_get_version(channel, "Иван"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "Иван" in details

    _run(scenario)


def test_guarded_unimplemented_method_still_answers_unimplemented(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle, participant_id="Макар") as channel,
        ):
            code, _ = await _status_of(_stub(channel).Status(pb.StatusRequest(), timeout=TIMEOUT_S))
        assert code == grpc.StatusCode.UNIMPLEMENTED

    _run(scenario)


def test_metadata_naming_another_participant_is_permission_denied(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle, participant_id="Макар") as channel,
        ):
            call = _get_version(channel, "Макар", metadata=participant_metadata("Иван"))
            code, _ = await _status_of(call)
        assert code == grpc.StatusCode.PERMISSION_DENIED

    _run(scenario)


def test_tls_call_that_does_not_name_its_participant_is_unauthenticated(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle) as channel,
        ):
            code, details = await _status_of(_get_version(channel, "Макар"))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "fedrl-participant-bin" in details

    _run(scenario)


def test_naming_the_participant_twice_is_unauthenticated(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")
    twice = participant_metadata("Макар") * 2

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle) as channel,
        ):
            code, details = await _status_of(_get_version(channel, "Макар", metadata=twice))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "more than once" in details

    _run(scenario)


def test_unreadable_revocation_list_refuses_every_call(mtls: Any) -> None:
    paths, ca, auth = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with (
            _serving(auth, server_credentials(paths)) as target,
            open_channel(target, bundle=bundle, participant_id="Макар") as channel,
        ):
            write_private(paths.revoked, b"{not json")
            code, _ = await _status_of(_get_version(channel, "Макар"))
        assert code == grpc.StatusCode.UNAUTHENTICATED

    _run(scenario)


# --------------------------------------------------------------------------
# Token mode (one-way TLS plus a bearer token)


@pytest.fixture
def token_mode(tmp_path: Path) -> tuple[TlsPaths, CertifiedKey, Authenticator]:
    paths, ca = _pki(tmp_path)
    return paths, ca, Authenticator(mode=AuthMode.TOKEN, paths=paths)


def test_token_identifies_its_participant(token_mode: Any) -> None:
    paths, ca, auth = token_mode
    token = issue_token(paths, "Макар")

    async def scenario() -> None:
        creds = server_credentials(paths, require_client_auth=False)
        async with (
            _serving(auth, creds) as target,
            open_channel(
                target, ca_cert=ca.cert_pem, token=token, participant_id="Макар"
            ) as channel,
        ):
            got = await _get_version(channel, "Макар")
        assert got == "Макар"

    _run(scenario)


def test_wrong_or_missing_token_is_unauthenticated(token_mode: Any) -> None:
    paths, ca, auth = token_mode
    issue_token(paths, "Макар")

    async def scenario() -> None:
        creds = server_credentials(paths, require_client_auth=False)
        async with _serving(auth, creds) as target:
            async with open_channel(target, ca_cert=ca.cert_pem, token="guess") as channel:
                wrong, _ = await _status_of(_get_version(channel, "Макар"))
            async with open_channel(target, ca_cert=ca.cert_pem) as channel:
                missing, _ = await _status_of(_get_version(channel, "Макар"))
        assert wrong == grpc.StatusCode.UNAUTHENTICATED
        assert missing == grpc.StatusCode.UNAUTHENTICATED

    _run(scenario)


def test_reissued_or_revoked_token_stops_working_without_restart(token_mode: Any) -> None:
    paths, ca, auth = token_mode
    first = issue_token(paths, "Макар")

    async def scenario() -> None:
        creds = server_credentials(paths, require_client_auth=False)
        async with _serving(auth, creds) as target:
            async with open_channel(
                target, ca_cert=ca.cert_pem, token=first, participant_id="Макар"
            ) as channel:
                assert await _get_version(channel, "Макар") == "Макар"
                second = issue_token(paths, "Макар")
                replaced, _ = await _status_of(_get_version(channel, "Макар"))
            async with open_channel(
                target, ca_cert=ca.cert_pem, token=second, participant_id="Макар"
            ) as channel:
                assert await _get_version(channel, "Макар") == "Макар"
                revoke(paths, "Макар")
                revoked, _ = await _status_of(_get_version(channel, "Макар"))
        assert replaced == grpc.StatusCode.UNAUTHENTICATED
        assert revoked == grpc.StatusCode.UNAUTHENTICATED

    _run(scenario)


def test_token_is_never_accepted_over_plaintext(token_mode: Any) -> None:
    paths, _, auth = token_mode
    token = issue_token(paths, "Макар")

    async def scenario() -> None:
        # A server misconfigured to plaintext in token mode still refuses the token.
        async with _serving(auth, None) as target, grpc.aio.insecure_channel(target) as channel:
            call = _get_version(channel, "Макар", metadata=(("authorization", f"Bearer {token}"),))
            code, details = await _status_of(call)
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "TLS" in details

    _run(scenario)


def test_health_check_needs_no_participant_identity(token_mode: Any) -> None:
    paths, ca, auth = token_mode

    async def scenario() -> None:
        creds = server_credentials(paths, require_client_auth=False)
        async with (
            _serving(auth, creds) as target,
            open_channel(target, ca_cert=ca.cert_pem) as channel,
        ):
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    _run(scenario)


# --------------------------------------------------------------------------
# Plaintext on loopback


def test_plaintext_loopback_server_takes_the_id_from_binary_metadata() -> None:
    auth = Authenticator(mode=AuthMode.INSECURE)

    async def scenario() -> None:
        async with _serving(auth, None) as target, open_channel(target) as channel:
            got = await _get_version(channel, "Макар", metadata=participant_metadata("Макар"))
            missing, _ = await _status_of(_get_version(channel, "Макар"))
        assert got == "Макар"
        assert missing == grpc.StatusCode.UNAUTHENTICATED

    _run(scenario)


def test_plaintext_channel_names_its_participant_on_every_call() -> None:
    auth = Authenticator(mode=AuthMode.INSECURE)

    async def scenario() -> None:
        async with (
            _serving(auth, None) as target,
            open_channel(target, participant_id="Макар") as channel,
        ):
            got = await _get_version(channel, "Макар")
        assert got == "Макар"

    _run(scenario)


def test_plaintext_server_serves_calls_that_name_no_participant() -> None:
    auth = Authenticator(mode=AuthMode.INSECURE)

    async def scenario() -> None:
        async with _serving(auth, None) as target, open_channel(target) as channel:
            request = pb.GetVersionRequest(session="s")
            notices = await _drain(_stub(channel).WatchVersions(request, timeout=TIMEOUT_S))
        assert [n.current_version for n in notices] == [0, 1]

    _run(scenario)


def test_tls_client_never_falls_back_to_a_plaintext_server(mtls: Any) -> None:
    paths, ca, _ = mtls
    bundle = _bundle(paths, ca, "Макар")

    async def scenario() -> None:
        async with (
            _serving(Authenticator(mode=AuthMode.INSECURE), None) as target,
            open_channel(target, bundle=bundle, participant_id="Макар") as channel,
        ):
            call = _get_version(channel, "Макар", metadata=participant_metadata("Макар"))
            code, _ = await _status_of(call)
        assert code == grpc.StatusCode.UNAVAILABLE

    _run(scenario)
