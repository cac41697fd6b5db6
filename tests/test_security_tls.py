"""The real server over real mutual TLS on 127.0.0.1: identity, transport policy, limits.

Also home of SecureFederation, which the other security suites
(test_security_hostile, test_security_poisoning, test_security_fuzz) start
their servers with: TLS material is generated in the test, put where
`fedrl-server init-tls` puts it, and every participant dials with its own
certificate, so each call runs through the handshake and the AuthInterceptor
exactly as a remote participant's would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import numpy as np
import pytest

from fedrl.common.tls import (
    CertifiedKey,
    TlsPaths,
    create_ca,
    issue_participant_cert,
    issue_server_cert,
    write_private,
)
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.auth import issue_token, record_issued, revoke
from tests.support.server_harness import (
    CHANNEL_OPTIONS,
    InProcessServer,
    join,
    make_spec,
    metadata,
    pull,
    push,
    seed,
    server_config,
    update_messages,
)

CALL_TIMEOUT_S = 30


class SecureFederation:
    """An in-process fedrl server serving mTLS with material made for this test.

    `stub(pid)` dials as participant pid with a certificate from the
    session's CA; `model_hash()` and `pending()` are what the hostile suites
    check after each refused call.
    """

    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        self.paths = TlsPaths.for_data_dir(data_dir)
        self.ca = create_ca("fedrl test session CA")
        server = issue_server_cert(self.ca, ["127.0.0.1", "localhost"])
        write_private(self.paths.ca_cert, self.ca.cert_pem)
        write_private(self.paths.ca_key, self.ca.key_pem)
        write_private(self.paths.server_cert, server.cert_pem)
        write_private(self.paths.server_key, server.key_pem)
        self.server = InProcessServer(server_config(data_dir, **overrides))
        self._certificates: dict[str, CertifiedKey] = {}
        self._channels: dict[str, grpc.Channel] = {}
        """One channel per participant, as a client keeps it (and file descriptors stay few)."""
        self._strangers: list[grpc.Channel] = []

    @property
    def address(self) -> str:
        return self.server.address

    def certificate(self, pid: str) -> CertifiedKey:
        """pid's client certificate, issued and recorded once, as `fedrl-server issue` does."""
        if pid not in self._certificates:
            pair = issue_participant_cert(self.ca, pid)
            record_issued(self.paths, pid, pair.cert_pem)
            self._certificates[pid] = pair
        return self._certificates[pid]

    def channel(self, pid: str) -> grpc.Channel:
        """pid's TLS channel, presenting its certificate."""
        if pid not in self._channels:
            self._channels[pid] = self._dial(self.certificate(pid))
        return self._channels[pid]

    def stranger_channel(self, certificate: CertifiedKey) -> grpc.Channel:
        """A TLS channel presenting a certificate this session did not issue."""
        opened = self._dial(certificate)
        self._strangers.append(opened)
        return opened

    def _dial(self, certificate: CertifiedKey) -> grpc.Channel:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca.cert_pem,
            private_key=certificate.key_pem,
            certificate_chain=certificate.cert_pem,
        )
        return grpc.secure_channel(self.address, credentials, options=CHANNEL_OPTIONS)

    def stub(self, pid: str) -> pb_grpc.FederationStub:
        return pb_grpc.FederationStub(self.channel(pid))  # type: ignore[no-untyped-call]

    def model_hash(self, pid: str, session: str = "default") -> tuple[int, str]:
        """(newest version, SHA-256 over its tensors' bytes), as a participant pulls it."""
        header, tensors, _ = pull(self.stub(pid), session=session, participant_id=pid)
        digest = hashlib.sha256()
        for tensor in tensors:
            digest.update(np.ascontiguousarray(tensor, dtype=np.float32).tobytes())
        return header.version, digest.hexdigest()

    def pending(self, session: str = "default") -> int:
        """Acknowledged updates of a session not yet folded into a version."""
        return self.server.call(self._pending(session))

    async def _pending(self, session: str) -> int:
        assert self.server.running is not None
        return self.server.running.federation.session(session).aggregator.pending

    def wait_for_version(self, pid: str, version: int, session: str = "default") -> None:
        """Block until the session's newest version is at least `version`."""
        stub = self.stub(pid)
        notices = stub.WatchVersions(
            pb.GetVersionRequest(session=session, participant_id=pid),
            metadata=metadata(pid),
            timeout=CALL_TIMEOUT_S,
        )
        for notice in notices:
            if notice.current_version >= version:
                notices.cancel()
                return
        raise AssertionError(f"session {session!r} never reached version {version}")

    def start(self) -> SecureFederation:
        self.server.start()
        return self

    def stop(self) -> None:
        for opened in [*self._channels.values(), *self._strangers]:
            opened.close()
        self._channels.clear()
        self._strangers.clear()
        self.server.stop()

    def __enter__(self) -> SecureFederation:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def seeded(
    federation: SecureFederation,
    pid: str,
    spec: tpb.ModelSpec,
    arrays: Sequence[np.ndarray],
    session: str = "default",
) -> pb_grpc.FederationStub:
    """Join pid and seed version 0 of the session; returns pid's stub."""
    stub = federation.stub(pid)
    join(stub, pid, spec, session=session)
    seed(stub, pid, spec, arrays, session=session)
    return stub


def rpc_error(call: Any) -> grpc.RpcError:
    """The error a call ends with; fails the test if it succeeds."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


SPEC = make_spec([(3, 2), (2,)])
ZERO = [np.zeros((3, 2)), np.zeros(2)]
ONES = [np.ones((3, 2)), np.ones(2)]


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[SecureFederation]:
    with SecureFederation(
        tmp_path, buffer_size=1, push_rate_per_s=0.01, push_burst=3, max_streams_per_participant=2
    ) as started:
        seeded(started, "owner", SPEC, ZERO)
        yield started


# Identity.


def test_participant_with_its_certificate_joins_pushes_and_pulls(
    federation: SecureFederation,
) -> None:
    stub = federation.stub("Макар")
    join(stub, "Макар", SPEC)

    reply = push(stub, "Макар", SPEC, ONES, sequence=1, base_version=0)
    federation.wait_for_version("Макар", 1)

    assert reply.sequence == 1 and not reply.duplicate
    header, tensors, _ = pull(stub, participant_id="Макар")
    assert header.version == 1
    assert np.allclose(tensors[0], 1.0) and np.allclose(tensors[1], 1.0)


def test_push_naming_another_participant_is_permission_denied(
    federation: SecureFederation,
) -> None:
    mallory = federation.stub("mallory")
    join(mallory, "mallory", SPEC)
    messages = update_messages("owner", SPEC, ONES, sequence=1, base_version=0)

    error = rpc_error(lambda: mallory.PushUpdate(iter(messages), metadata=metadata("mallory")))

    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "mallory" in (error.details() or "")
    assert federation.pending() == 0


def test_join_naming_another_participant_is_permission_denied(
    federation: SecureFederation,
) -> None:
    mallory = federation.stub("mallory")
    request = pb.JoinRequest(session="default", participant_id="owner", spec=SPEC)

    error = rpc_error(lambda: mallory.Join(request, metadata=metadata("mallory")))

    assert error.code() == grpc.StatusCode.PERMISSION_DENIED


def test_metadata_claiming_another_participant_is_permission_denied(
    federation: SecureFederation,
) -> None:
    mallory = federation.stub("mallory")

    error = rpc_error(lambda: join(mallory, "owner", SPEC))

    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "mallory" in (error.details() or "")


def test_call_without_participant_metadata_is_unauthenticated(
    federation: SecureFederation,
) -> None:
    stub = federation.stub("owner")
    request = pb.GetVersionRequest(session="default", participant_id="owner")

    error = rpc_error(lambda: stub.GetVersion(request, timeout=CALL_TIMEOUT_S))

    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_revoked_participant_is_refused_on_its_next_call(federation: SecureFederation) -> None:
    stub = federation.stub("leaver")
    join(stub, "leaver", SPEC)

    revoke(federation.paths, "leaver")
    error = rpc_error(lambda: join(stub, "leaver", SPEC))

    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


# Transport policy.


def test_plaintext_client_cannot_reach_tls_server(federation: SecureFederation) -> None:
    with grpc.insecure_channel(federation.address) as plain:
        stub = pb_grpc.FederationStub(plain)  # type: ignore[no-untyped-call]

        error = rpc_error(lambda: join(stub, "owner", SPEC))

    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_certificate_from_another_ca_fails_the_handshake(federation: SecureFederation) -> None:
    stranger = issue_participant_cert(create_ca("someone else's CA"), "owner")
    stub = pb_grpc.FederationStub(  # type: ignore[no-untyped-call]
        federation.stranger_channel(stranger)
    )

    error = rpc_error(lambda: join(stub, "owner", SPEC))

    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_token_participant_over_one_way_tls_acts_as_itself(tmp_path: Path) -> None:
    with SecureFederation(tmp_path, token_auth=True, buffer_size=1) as federation:
        token = issue_token(federation.paths, "Zoë")
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(root_certificates=federation.ca.cert_pem),
            grpc.access_token_call_credentials(token),
        )
        with grpc.secure_channel(federation.address, credentials, options=CHANNEL_OPTIONS) as ch:
            stub = pb_grpc.FederationStub(ch)  # type: ignore[no-untyped-call]

            joined = join(stub, "Zoë", SPEC)
            impostor = rpc_error(lambda: join(stub, "owner", SPEC))

    assert joined.current_version == -1
    assert impostor.code() == grpc.StatusCode.PERMISSION_DENIED


# Limits.


def test_push_rate_limit_is_resource_exhausted_and_names_the_limit(
    federation: SecureFederation,
) -> None:
    stub = federation.stub("eager")
    join(stub, "eager", SPEC)
    for sequence in (1, 2, 3):
        push(stub, "eager", SPEC, ONES, sequence=sequence, base_version=0)

    error = rpc_error(lambda: push(stub, "eager", SPEC, ONES, sequence=4, base_version=0))

    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit" in (error.details() or "")


def test_streams_past_the_per_participant_limit_are_resource_exhausted(
    federation: SecureFederation,
) -> None:
    stub = federation.stub("watcher")
    request = pb.GetVersionRequest(session="default", participant_id="watcher")
    open_streams = [
        stub.WatchVersions(request, metadata=metadata("watcher"), timeout=CALL_TIMEOUT_S)
        for _ in range(2)
    ]
    for stream in open_streams:
        next(stream)

    error = rpc_error(
        lambda: next(stub.WatchVersions(request, metadata=metadata("watcher"), timeout=30))
    )

    for stream in open_streams:
        stream.cancel()
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "stream limit" in (error.details() or "")


def test_spec_above_the_model_size_limit_is_resource_exhausted(tmp_path: Path) -> None:
    with SecureFederation(tmp_path, max_model_bytes=1 << 20) as federation:
        huge = make_spec([(1024, 1024)])

        error = rpc_error(lambda: join(federation.stub("big"), "big", huge))

    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max-model-bytes" in (error.details() or "")


def test_spec_with_integer_tensors_is_refused_before_it_fixes_a_session(
    federation: SecureFederation,
) -> None:
    spec = make_spec([(4,)])
    spec.tensors[0].dtype = tpb.DTYPE_INT64

    error = rpc_error(lambda: join(federation.stub("counter"), "counter", spec, session="ints"))

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "float32" in (error.details() or "")
