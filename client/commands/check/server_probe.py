"""The check's look at the server: TCP reachability, its TLS certificate, and a health call.

The health call runs over the credentials every client command uses
(fedrl.client.federation.channel.tls_credentials), so what the check sees
is what training will see.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedrl.client.federation.channel import is_loopback_target, read_ca_pem, tls_credentials
from fedrl.common.tls import ParticipantBundle


@dataclass(frozen=True)
class ServerCheck:
    """What a connection to the server showed; `problems` empty means all good."""

    target: str
    reachable: bool
    tls: str
    """"verified (...)", "plaintext (...)", or why the certificate does not verify."""
    service: str
    """The gRPC health answer, or the error that came instead."""
    problems: tuple[str, ...]


def check_server(
    target: str,
    *,
    ca_cert: Path | None,
    insecure: bool,
    bundle: ParticipantBundle | None = None,
    timeout_s: float = 5.0,
) -> ServerCheck:
    """TCP reachability, the server's TLS certificate (verified as gRPC would), a health call.

    With a participant bundle the health call runs over mutual TLS, so it also
    shows whether the server accepts this participant's certificate.
    """
    host, port = _split_target(target)
    problems: list[str] = []
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        return ServerCheck(target, False, "-", "-", (f"cannot connect to {target}: {reason}",))
    if bundle is not None:
        ca_pem: bytes | None = bundle.ca_pem
    else:
        ca_pem = None if ca_cert is None else read_ca_pem(ca_cert)
    plaintext = ca_pem is None and (insecure or is_loopback_target(target))
    if plaintext:
        tls = "plaintext (" + ("--insecure" if insecure else "loopback") + ")"
    else:
        tls = _verify_tls(host, port, ca_pem, timeout_s)
        if not tls.startswith("verified"):
            problems.append(f"TLS: {tls}")
    credentials = None if plaintext else tls_credentials(ca_pem=ca_pem, bundle=bundle)
    service = _health(target, credentials, timeout_s)
    if service != "SERVING":
        hint = ""
        if bundle is None and not plaintext and tls.startswith("verified"):
            hint = " (a server with mutual TLS needs your participant bundle: pass --bundle)"
        problems.append(f"gRPC: {service}{hint}")
    return ServerCheck(target, True, tls, service, tuple(problems))


def _split_target(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--server must be host:port, got {target!r}")
    return host.strip("[]"), int(port)


def _verify_tls(host: str, port: int, ca_pem: bytes | None, timeout_s: float) -> str:
    """The handshake gRPC will do: chain to the CA (or the system's roots) and the host name."""
    context = ssl.create_default_context()
    if ca_pem is not None:
        context = ssl.create_default_context(cadata=ca_pem.decode("ascii", "replace"))
    context.set_alpn_protocols(["h2"])
    roots = "the session CA" if ca_pem is not None else "the system's trusted roots"
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            cert = tls.getpeercert() or {}
            until = cert.get("notAfter", "?")
            return f"verified against {roots}, valid until {until}, {tls.version()}"
    except ssl.SSLCertVerificationError as exc:
        hint = "" if ca_pem is not None else "; pass --ca-cert with the session's CA"
        return f"certificate does not verify against {roots}: {exc.verify_message}{hint}"
    except ssl.SSLError as exc:
        return f"TLS handshake failed ({exc.reason or exc}); is the server serving TLS?"
    except OSError as exc:
        return f"TLS handshake failed: {exc.strerror or exc}"


def _health(target: str, credentials: grpc.ChannelCredentials | None, timeout_s: float) -> str:
    """The standard health service's answer; servers exempt it from participant auth."""
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
