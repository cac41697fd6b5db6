"""The server's TLS: a renewed certificate is used without a restart; TLS below 1.2 is refused."""

from __future__ import annotations

import socket
import ssl
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from fedrl.common.tls import issue_server_cert, write_private
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.secure_federation import CALL_TIMEOUT_S, SecureFederation
from tests.support.server_harness import metadata


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[SecureFederation]:
    with SecureFederation(tmp_path / "server") as started:
        yield started


def served_certificate(federation: SecureFederation, tmp_path: Path, **versions: object) -> bytes:
    """The certificate the server presents to a new TLS connection, as DER."""
    client = federation.certificate("probe")
    cert, key = tmp_path / "probe.crt", tmp_path / "probe.key"
    write_private(cert, client.cert_pem)
    write_private(key, client.key_pem)
    context = ssl.create_default_context(cadata=federation.ca.cert_pem.decode("ascii"))
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    # Let this OpenSSL offer old versions at all: the server is what must refuse them.
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    for name, value in versions.items():
        setattr(context, name, value)
    with (
        socket.create_connection(("127.0.0.1", federation.server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


def test_a_renewed_server_certificate_is_served_without_a_restart(
    federation: SecureFederation, tmp_path: Path
) -> None:
    first = served_certificate(federation, tmp_path)
    renewed = issue_server_cert(federation.ca, ["127.0.0.1", "localhost"])
    write_private(federation.paths.server_key, renewed.key_pem)
    write_private(federation.paths.server_cert, renewed.cert_pem)

    second = served_certificate(federation, tmp_path)
    status = federation.stub("Макар").Status(
        pb.StatusRequest(), metadata=metadata("Макар"), timeout=CALL_TIMEOUT_S
    )

    assert first != second
    assert second == der(renewed.cert_pem)
    assert status.server_time_unix_ms > 0


def test_a_renewal_that_does_not_load_keeps_the_current_certificate(
    federation: SecureFederation, tmp_path: Path
) -> None:
    first = served_certificate(federation, tmp_path)
    other = issue_server_cert(federation.ca, ["127.0.0.1"])
    # A certificate without its key: a renewal copied halfway.
    write_private(federation.paths.server_cert, other.cert_pem)

    assert served_certificate(federation, tmp_path) == first


@pytest.mark.parametrize("version", ["TLSv1", "TLSv1_1"])
def test_tls_below_1_2_is_refused(
    federation: SecureFederation, tmp_path: Path, version: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = getattr(ssl.TLSVersion, version)
    # BoringSSL answers UNSUPPORTED_PROTOCOL and closes: the client sees an EOF.
    with pytest.raises(ssl.SSLError):
        served_certificate(federation, tmp_path, minimum_version=old, maximum_version=old)
    # The same client offering TLS 1.2 is served: the refusal was the version.
    tls12 = ssl.TLSVersion.TLSv1_2
    served_certificate(federation, tmp_path, minimum_version=tls12, maximum_version=tls12)
