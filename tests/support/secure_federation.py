"""SecureFederation: a real in-process server over mutual TLS, for the security suites.

TLS material is generated in the test, put where `fedrl-server init-tls`
puts it, and every participant dials with its own certificate, so each call
runs through the handshake and the AuthInterceptor exactly as a remote
participant's would.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
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
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.security.auth import record_issued
from tests.support.server_harness import (
    CHANNEL_OPTIONS,
    InProcessServer,
    join,
    make_spec,
    pull,
    seed,
    server_config,
    wait_for_version,
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
        wait_for_version(
            self.stub(pid), version, session=session, participant_id=pid, timeout_s=CALL_TIMEOUT_S
        )

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
