"""The participant's gRPC channel: TLS to the server by default, plaintext only when asked.

The channel never falls back to plaintext. When TLS material is given, a
server that does not complete a verified TLS handshake is UNAVAILABLE; when
none is given, plaintext is used only for a loopback target or with an
explicit ``insecure=True``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from fedrl.common.config_cli import doc
from fedrl.common.identity import id_to_metadata
from fedrl.common.tls import ParticipantBundle, TlsMaterialError, is_loopback, load_cert

log = logging.getLogger(__name__)

ChannelOptions = Sequence[tuple[str, Any]]


CONNECTION_OPTIONS: ChannelOptions = (
    # The participant holds a WatchVersions stream open for hours, often
    # behind NAT. A server that vanished without closing the connection (a
    # dropped mapping, a dead host) would leave that stream waiting forever:
    # a ping every 60 s, answered within 20 s, finds it, and the stream ends
    # with UNAVAILABLE so the participant reconnects. The server accepts
    # pings as often as every 10 s (fedrl.server.transport.grpc_server.server_options).
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    # By default a client stops pinging after two pings without data in
    # between; an idle watch stream sends no data for as long as no version
    # is made, and must stay watched all that time.
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC's own reconnect backoff grows to 120 s, and a call meanwhile fails
    # at once; capped like BackoffPolicy.cap_s, a server back after a long
    # outage is reached within the participant's own retry schedule.
    ("grpc.max_reconnect_backoff_ms", 30_000),
)


class ChannelSecurityError(ValueError):
    """The requested channel would be less secure than the rules allow."""


@dataclass(frozen=True)
class ConnectionSecurity:
    """How a participant's command reaches a server: TLS material, a token, or plaintext.

    One section of options shared by every client command that dials a server.
    """

    ca_cert: Path | None = field(
        default=None,
        metadata=doc(
            "CA certificate (PEM file) that verifies a TLS server (one-way TLS).",
            path="file",
            exists=True,
        ),
    )
    bundle: Path | None = field(
        default=None,
        metadata=doc(
            "Participant bundle (PEM file from `fedrl-server issue`) for mutual TLS: its CA "
            "verifies the server, its certificate is shown to the server.",
            path="file",
            exists=True,
        ),
    )
    token_file: Path | None = field(
        default=None,
        metadata=doc(
            "File holding this participant's bearer token (token-mode servers, with "
            "--ca-cert); never the token itself: the command line is visible in ps.",
            path="file",
            exists=True,
        ),
    )
    insecure: bool = field(
        default=False,
        metadata=doc(
            "Allow plaintext to a server that is not on this machine (everything travels readable)."
        ),
    )

    def __post_init__(self) -> None:
        check_security_choice(
            ca_cert=self.ca_cert is not None,
            bundle=self.bundle is not None,
            token=self.token_file is not None,
            insecure=self.insecure,
        )

    def read_bundle(self) -> ParticipantBundle | None:
        """The participant bundle, if one is given (TlsMaterialError if it cannot be used)."""
        return ParticipantBundle.read(self.bundle) if self.bundle is not None else None

    def read_token(self) -> str | None:
        """The bearer token from --token-file, if one is given."""
        if self.token_file is None:
            return None
        try:
            token = self.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ChannelSecurityError(
                f"--token-file {self.token_file} cannot be read: {exc}"
            ) from None
        if not token:
            raise ChannelSecurityError(
                f"--token-file {self.token_file} is empty: it must hold the bearer token"
            )
        return token

    def open(self, target: str, *, participant_id: str | None = None) -> grpc.aio.Channel:
        """A channel to `target` secured as these options say (see open_channel)."""
        return open_channel(
            target,
            ca_cert=self.ca_cert,
            bundle=self.read_bundle(),
            token=self.read_token(),
            insecure=self.insecure,
            participant_id=participant_id,
        )


def check_security_choice(*, ca_cert: bool, bundle: bool, token: bool, insecure: bool) -> None:
    """Refuse a combination that could not mean what was asked (ChannelSecurityError)."""
    if bundle and ca_cert:
        raise ChannelSecurityError("give either --bundle or --ca-cert, not both")
    if insecure and (bundle or ca_cert or token):
        raise ChannelSecurityError(
            "--insecure contradicts --ca-cert, --bundle and --token-file; drop one of them"
        )


def open_channel(
    target: str,
    *,
    ca_cert: bytes | Path | None = None,
    bundle: ParticipantBundle | None = None,
    token: str | None = None,
    insecure: bool = False,
    participant_id: str | None = None,
    options: ChannelOptions = (),
) -> grpc.aio.Channel:
    """A channel to ``target`` ("host:port").

    With ``participant_id`` every call names the participant in binary
    metadata, which a plaintext server needs and a TLS server checks against
    the certificate or token.

    - ``bundle``: mutual TLS with the participant's certificate; the bundle's
      CA verifies the server.
    - ``ca_cert`` (PEM bytes or a path): one-way TLS, verifying the server.
    - ``token``: sent as a Bearer token; needs TLS (gRPC sends call
      credentials over secure channels only, and so do we).
    - none of these: plaintext, for a loopback target or with ``insecure``.

    CONNECTION_OPTIONS (keepalive, reconnect backoff) apply unless ``options`` overrides them.
    """
    options = list({**dict(CONNECTION_OPTIONS), **dict(options)}.items())
    check_security_choice(
        ca_cert=ca_cert is not None,
        bundle=bundle is not None,
        token=token is not None,
        insecure=insecure,
    )
    if bundle is None and ca_cert is None:
        _check_plaintext(target, token=token, insecure=insecure)
        return grpc.aio.insecure_channel(
            target, options=list(options), interceptors=_interceptors(participant_id)
        )
    credentials = tls_credentials(
        ca_pem=None if ca_cert is None else read_ca_pem(ca_cert), bundle=bundle
    )
    if token is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return grpc.aio.secure_channel(
        target, credentials, options=list(options), interceptors=_interceptors(participant_id)
    )


def tls_credentials(
    *, ca_pem: bytes | None, bundle: ParticipantBundle | None
) -> grpc.ChannelCredentials:
    """TLS credentials for a channel to the server: every client command builds them here.

    With a participant `bundle`: mutual TLS, the bundle's CA verifies the
    server and its certificate is shown to the server. Else one-way TLS,
    verifying the server against `ca_pem`, or against the system's trusted
    roots where that is None.
    """
    if bundle is not None:
        return grpc.ssl_channel_credentials(
            root_certificates=bundle.ca_pem,
            private_key=bundle.key_pem,
            certificate_chain=bundle.cert_pem,
        )
    return grpc.ssl_channel_credentials(root_certificates=ca_pem)


def _check_plaintext(target: str, *, token: str | None, insecure: bool) -> None:
    if token is not None:
        raise ChannelSecurityError(
            "a token is sent only over TLS: pass --ca-cert with the session's CA certificate"
        )
    loopback = is_loopback_target(target)
    if not insecure and not loopback:
        raise ChannelSecurityError(
            f"{target} is not a loopback address: pass a participant bundle or --ca-cert "
            "for TLS, or --insecure to send everything in plaintext"
        )
    if not loopback:
        log.warning("connecting to %s in PLAINTEXT (--insecure)", target)


class _Naming:
    """Adds the participant's binary id metadata to a call that does not carry it yet."""

    def __init__(self, participant_id: str) -> None:
        self._key, self._value = id_to_metadata(participant_id)

    def _named(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        if self._key not in metadata:
            metadata.add(self._key, self._value)
        return details._replace(metadata=metadata)


# One class per call kind: grpc.aio files an interceptor under the first kind
# it is an instance of, so one class implementing all four would name unary
# calls only.
class _NameUnaryUnary(_Naming, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._named(details), request)


class _NameUnaryStream(_Naming, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._named(details), request)


class _NameStreamUnary(_Naming, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._named(details), requests)


class _NameStreamStream(_Naming, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._named(details), requests)


def _interceptors(participant_id: str | None) -> list[_Naming] | None:
    if participant_id is None:
        return None
    kinds = (_NameUnaryUnary, _NameUnaryStream, _NameStreamUnary, _NameStreamStream)
    return [kind(participant_id) for kind in kinds]


def read_ca_pem(ca_cert: bytes | Path) -> bytes:
    """The CA certificate, checked now: a bad one would otherwise surface as UNAVAILABLE."""
    if isinstance(ca_cert, bytes):
        pem = ca_cert
    else:
        try:
            pem = ca_cert.read_bytes()
        except OSError as exc:
            raise TlsMaterialError(f"--ca-cert {ca_cert}: {exc.strerror}") from None
    load_cert(pem)
    return pem


def participant_metadata(participant_id: str) -> tuple[tuple[str, bytes]]:
    """Per-call metadata naming the participant in binary (UTF-8) form.

    Required on a plaintext server, which has nothing else to go on; over TLS
    the server checks it against the authenticated identity.
    """
    return (id_to_metadata(participant_id),)


def is_loopback_target(target: str) -> bool:
    """Whether a gRPC target names this machine only (literal loopback, localhost, unix socket)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    host = target
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if host.startswith(scheme):
            host = host[len(scheme) :]
            break
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return is_loopback(host)
