"""Who is calling: every RPC's participant, from its certificate or token, checked on each call.

The participant a call acts as comes from the authenticated transport, never
from a field the caller fills in. Revocations and token changes are files in
the server's TLS folder that the running server re-reads when they change, so
a revoke takes effect on the participant's next call, open connections
included, without a restart.

Tokens are stored as SHA-256 hashes, not scrypt: a token is 256 random bits,
so no dictionary or brute-force attack on a leaked hash is feasible and a slow
hash would add nothing but CPU on every call (and a lever for overload).
Looking tokens up by their hash also makes lookup timing worthless to an
attacker: learning a stored hash does not reveal a token.
"""

from __future__ import annotations

import datetime as dt
import enum
import fcntl
import functools
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NoReturn, TypeVar

import grpc
from cryptography import x509

from fedrl.common.identity import METADATA_KEY, id_from_metadata, validate_participant_id
from fedrl.common.tls import (
    CertifiedKey,
    TlsMaterialError,
    TlsPaths,
    is_loopback,
    load_cert,
    participant_id_from_cert,
    write_private,
)
from fedrl.server.transport.call_context import CallError
from fedrl.server.transport.handlers import GuardingInterceptor, guard_handler

log = logging.getLogger(__name__)

V = TypeVar("V")
# grpc ships no stubs; invocation metadata is a sequence of (key, value) named tuples.
Metadata = Any

_BEARER = "bearer "
_TOKEN_BYTES = 32
"""256 random bits per token: unguessable, so a fast hash is enough (see the module docstring)."""
_RECORDS_VERSION = 1

HEALTH_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
"""Methods a load balancer or `grpc_health_probe` calls without participant credentials;
pass as AuthInterceptor(exempt=...)."""


class AuthMode(enum.StrEnum):
    """How the server learns who is calling."""

    MTLS = "mtls"
    """Client certificates from the session CA (the default with TLS)."""
    TOKEN = "token"
    """One-way TLS plus a per-participant bearer token."""
    INSECURE = "insecure"
    """Plaintext: the id in metadata is believed. Loopback only, or an explicit --insecure."""


class AuthError(CallError):
    """A call that may not proceed; ``code`` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class InsecureBindError(ValueError):
    """A plaintext server on an address other hosts can reach, without --insecure."""


# --------------------------------------------------------------------------
# Credential records: issued.json, revoked.json, tokens.json in the TLS dir.


@dataclass(frozen=True)
class Revocation:
    """What one revoke removed."""

    participant_id: str
    serials: tuple[str, ...]
    """Hex serials of the participant's certificates now refused."""
    tokens: int
    """Number of the participant's tokens deleted."""


def record_issued(paths: TlsPaths, participant_id: str, cert_pem: bytes) -> None:
    """Remember an issued participant certificate, so that a later revoke can name its serial."""
    cert = load_cert(cert_pem)
    entry = {
        "participant_id": participant_id,
        "serial": _serial(cert),
        "not_after": cert.not_valid_after_utc.isoformat(),
        "issued_unix": int(time.time()),
    }
    with _locked(paths):
        records = _read_records(paths.issued, "certificates")
        _write_records(paths.issued, "certificates", [*records, entry])


def issue_token(paths: TlsPaths, participant_id: str) -> str:
    """A new bearer token for a participant, replacing any earlier one; only its hash is stored.

    The token is returned once and exists nowhere else: a participant who
    loses it gets a new one, which also shuts out whoever found the old one.
    """
    pid = validate_participant_id(participant_id)
    token = secrets.token_urlsafe(_TOKEN_BYTES)
    entry = {"participant_id": pid, "sha256": _token_hash(token), "issued_unix": int(time.time())}
    with _locked(paths):
        kept = [t for t in _read_records(paths.tokens, "tokens") if t["participant_id"] != pid]
        _write_records(paths.tokens, "tokens", [*kept, entry])
    return token


def revoke(paths: TlsPaths, participant_id: str) -> Revocation:
    """Refuse every certificate issued so far to a participant and delete its tokens.

    A certificate issued after this has a new serial and works: that is how a
    participant whose laptop was stolen gets back in.
    """
    pid = validate_participant_id(participant_id)
    now = int(time.time())
    with _locked(paths):
        issued = {
            c["serial"]
            for c in _read_records(paths.issued, "certificates")
            if c["participant_id"] == pid
        }
        revoked = _read_records(paths.revoked, "revoked")
        already = {r["serial"] for r in revoked}
        new = sorted(issued - already)
        tokens = _read_records(paths.tokens, "tokens")
        kept = [t for t in tokens if t["participant_id"] != pid]
        if new:
            entries = [{"participant_id": pid, "serial": s, "revoked_unix": now} for s in new]
            _write_records(paths.revoked, "revoked", [*revoked, *entries])
        if len(kept) != len(tokens):
            _write_records(paths.tokens, "tokens", kept)
    return Revocation(pid, tuple(new), len(tokens) - len(kept))


@contextmanager
def _locked(paths: TlsPaths) -> Iterator[None]:
    """Serialise read-modify-write of the records between concurrent operator commands.

    A lost write to issued.json would leave a certificate that no revoke can
    name, so two `fedrl-server issue` runs at once must not interleave.
    """
    paths.root.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(paths.lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_RECORD_FIELDS = {
    "certificates": ("participant_id", "serial"),
    "revoked": ("participant_id", "serial"),
    "tokens": ("participant_id", "sha256"),
}
"""Text fields every record of each file must have; anything less is a damaged file."""


def _read_records(path: Path, key: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise TlsMaterialError(f"{path}: unreadable ({exc}); restore it from a backup") from None
    records = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(records, list) or doc.get("version") != _RECORDS_VERSION:
        raise TlsMaterialError(f"{path}: expected {{'version': 1, '{key}': [...]}}")
    for i, record in enumerate(records):
        fields = _RECORD_FIELDS[key]
        if not isinstance(record, dict) or not all(isinstance(record.get(f), str) for f in fields):
            raise TlsMaterialError(f"{path}: record {i} lacks one of {', '.join(fields)}")
    return records


def _write_records(path: Path, key: str, records: list[dict[str, Any]]) -> None:
    doc = {"version": _RECORDS_VERSION, key: records}
    write_private(path, json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8"))


class _WatchedRecords(Generic[V]):
    """A records file re-read only when it changes: one stat per call, no parsing.

    Writers replace the file atomically, so each new version has a new inode
    and the (inode, mtime, size) triple changes even within one clock tick.
    """

    def __init__(self, path: Path, key: str, index: Callable[[list[dict[str, Any]]], V]) -> None:
        self._path = path
        self._key = key
        self._index = index
        self._stamp: tuple[int, int, int] | None = None
        self._value = index([])

    def get(self) -> V:
        try:
            st = os.stat(self._path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        if stamp != self._stamp:
            # Fail closed: a broken revocation list must not let revoked callers in.
            try:
                value = self._index(_read_records(self._path, self._key))
            except TlsMaterialError as exc:
                log.error("refusing calls: %s", exc)
                raise AuthError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "the server cannot read its credential records; tell the operator",
                ) from exc
            self._value, self._stamp = value, stamp
        return self._value


class _CertificateCheck:
    """Participant from the client certificate the TLS handshake verified, unless revoked."""

    def __init__(self, paths: TlsPaths) -> None:
        self._revoked = _WatchedRecords(
            paths.revoked, "revoked", lambda rs: frozenset(str(r["serial"]) for r in rs)
        )

    def participant(self, auth: dict[str, list[bytes]], _metadata: Metadata) -> str:
        pems = auth.get("x509_pem_cert")
        if not pems:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "no client certificate presented")
        try:
            pid, serial, not_after = _certificate_facts(pems[0])
        except TlsMaterialError as exc:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, f"client certificate: {exc}") from None
        # The handshake checked validity when the connection opened; a
        # connection can outlive the certificate, so check again per call.
        if dt.datetime.now(dt.UTC) > not_after:
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED,
                f"client certificate of {pid!r} expired at {not_after:%Y-%m-%d %H:%M} UTC",
            )
        if serial in self._revoked.get():
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED,
                f"client certificate of {pid!r} (serial {serial}) has been revoked",
            )
        return pid


class TokenBook:
    """The issued bearer tokens, by hash; re-read when tokens.json changes, so a revoke
    takes effect on the next check. Shared by gRPC calls and the web dashboard."""

    def __init__(self, paths: TlsPaths) -> None:
        self._tokens = _WatchedRecords(
            paths.tokens,
            "tokens",
            lambda rs: {str(t["sha256"]): str(t["participant_id"]) for t in rs},
        )

    def holder(self, token: str) -> str | None:
        """The participant a token was issued to; None for an unknown or revoked one.

        AuthError (UNAUTHENTICATED) when tokens.json cannot be read: fail closed.
        """
        return self._tokens.get().get(_token_hash(token))


class _TokenCheck:
    """Participant from the Bearer token in the call's metadata, by the token's hash."""

    def __init__(self, paths: TlsPaths) -> None:
        self._tokens = TokenBook(paths)

    def participant(self, _auth: dict[str, list[bytes]], metadata: Metadata) -> str:
        values = [m.value for m in metadata if m.key == "authorization"]
        if len(values) != 1 or not isinstance(values[0], str):
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED, "send exactly one 'authorization: Bearer' token"
            )
        if not values[0].lower().startswith(_BEARER):
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "authorization must be a Bearer token")
        pid = self._tokens.holder(values[0][len(_BEARER) :])
        if pid is None:
            raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked token")
        return pid


# --------------------------------------------------------------------------
# Authenticating calls.


class Authenticator:
    """Maps a call to the participant it is authenticated as, per the server's mode."""

    def __init__(self, *, mode: AuthMode, paths: TlsPaths | None = None) -> None:
        self.mode = mode
        self._check: _CertificateCheck | _TokenCheck | None = None
        """How a TLS call proves who it is; None on a plaintext server."""
        if mode is not AuthMode.INSECURE:
            if paths is None:
                raise ValueError(f"auth mode {mode} needs the server's TLS folder")
            self._check = _CertificateCheck(paths) if mode is AuthMode.MTLS else _TokenCheck(paths)

    def identify(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The participant this call is authenticated as; AuthError (UNAUTHENTICATED,
        PERMISSION_DENIED) when it is not, or when it claims another id in metadata."""
        metadata = context.invocation_metadata() or ()
        claimed = _claimed_id(metadata)
        if self._check is None:
            if claimed is None:
                raise AuthError(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "plaintext server: send your participant id as fedrl-participant-bin metadata",
                )
            return claimed
        auth = context.auth_context()
        if auth.get("transport_security_type") != [b"ssl"]:
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED, "credentials are accepted only over TLS"
            )
        pid = self._check.participant(auth, metadata)
        if claimed is not None and claimed != pid:
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"authenticated as {pid!r}, cannot act as {claimed!r}",
            )
        return pid

    async def authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """identify(), answering the call with the error's status when it fails."""
        try:
            return self.identify(context)
        except AuthError as exc:
            await _abort(context, exc)


class AuthInterceptor(GuardingInterceptor):
    """Authenticates every call before its handler runs, so no RPC can forget to.

    Over TLS each call must also name its participant in fedrl-participant-bin
    metadata, matching the authenticated one: a servicer that reads the id
    from metadata then reads an authenticated id, and checks the id a
    request names against it (server/call_context.acting_as). Handlers are
    grpc.aio ones (async); a plain-function handler runs inline.
    """

    def __init__(
        self, authenticator: Authenticator, *, exempt: frozenset[str] = frozenset()
    ) -> None:
        self._auth = authenticator
        self._exempt = exempt
        """Full method names open to anyone who completes the handshake, e.g. health checks."""

    def guard(self, handler: Any, method: str) -> grpc.RpcMethodHandler:
        # On plaintext nobody is authenticated, so there is nothing to check up
        # front: a caller is who its metadata says.
        if self._auth.mode is AuthMode.INSECURE or method in self._exempt:
            return handler
        return _guarded(handler, self._auth)


async def _authenticate_claim(auth: Authenticator, context: Any) -> None:
    """Authenticate, and insist that the call names its participant in metadata.

    identify() already refuses a name other than the authenticated one; also
    refusing a missing name means any code that reads the id from metadata
    reads an authenticated id.
    """
    await auth.authenticate(context)
    if _claimed_id(context.invocation_metadata() or ()) is None:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"name yourself in {METADATA_KEY} metadata (fedrl-client does it for you)",
        )


def _guarded(handler: Any, auth: Authenticator) -> grpc.RpcMethodHandler:
    async def prepare(request: Any, context: Any, requests_stream: bool) -> Any:
        await _authenticate_claim(auth, context)
        return request

    return guard_handler(handler, prepare)


def _claimed_id(metadata: Metadata) -> str | None:
    """The id the caller names in metadata, if any; two names (even equal ones) are refused,
    so no reader can pick a different one from the one checked."""
    claims = [(m.key, m.value) for m in metadata if m.key == METADATA_KEY]
    if len(claims) > 1:
        raise AuthError(grpc.StatusCode.UNAUTHENTICATED, f"{METADATA_KEY} sent more than once")
    try:
        return id_from_metadata(claims)
    except ValueError as exc:
        raise AuthError(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from None


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: AuthError) -> NoReturn:
    await context.abort(exc.code, exc.message)
    raise AssertionError("context.abort returned")  # abort always raises; this tells mypy


@functools.lru_cache(maxsize=4096)
def _certificate_facts(pem: bytes) -> tuple[str, str, dt.datetime]:
    """(participant id, hex serial, expiry) of a PEM certificate; cached, calls repeat it."""
    cert = load_cert(pem)
    return participant_id_from_cert(cert), _serial(cert), cert.not_valid_after_utc


def _serial(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------
# Transport policy.


def server_credentials(
    paths: TlsPaths, *, require_client_auth: bool = True
) -> grpc.ServerCredentials:
    """TLS credentials from the server's TLS folder, reloaded when its files change.

    A renewed server certificate (or key, or CA) put in place is used from
    the next TLS handshake on, without a restart: gRPC asks the fetcher for
    a configuration at every handshake (ServerCertificates.fetch).

    TLS versions: gRPC's Python API has no way to set them (its core keeps
    the setter to itself: "Plumb to wrapped languages", a TODO in
    ssl_credentials.h), and its core's server config fixes the range at
    TLS 1.2 to 1.3 (grpc_ssl_server_config: min_tls_version = TLS1_2), which
    tests/test_security_tls.py checks by offering TLS 1.1 and 1.0.

    With client auth required (mTLS), a client certificate not issued by the
    session CA, or expired, fails the handshake before any RPC runs.
    """
    certificates = ServerCertificates(paths)
    return grpc.dynamic_ssl_server_credentials(
        certificates.initial(),
        certificates.fetch,
        require_client_authentication=require_client_auth,
    )


class ServerCertificates:
    """The server's certificate, key and CA from the TLS folder, re-read when they change.

    A change is noticed by the files' (mtime, size); a new set that does not
    load (a half-copied key, a certificate that does not match its key) is
    logged and the current one kept, so a botched renewal never stops the
    server from accepting connections.
    """

    def __init__(self, paths: TlsPaths) -> None:
        if not paths.has_server_material():
            raise TlsMaterialError(
                f"no TLS material in {paths.root}: run `fedrl-server init-tls --host NAME`"
            )
        self._paths = paths
        self._files = (paths.server_cert, paths.server_key, paths.ca_cert)
        self._seen = self._stamp()
        self._lock = threading.Lock()

    def initial(self) -> Any:
        """The configuration to start with; raises TlsMaterialError when it does not load."""
        return self._load()

    def fetch(self) -> Any:
        """gRPC's certificate_configuration_fetcher: a new configuration, or None to keep."""
        with self._lock:
            try:
                stamp = self._stamp()
            except OSError as exc:
                log.error(
                    "TLS material in %s unreadable (%s); keeping the current", self._paths.root, exc
                )
                return None
            if stamp == self._seen:
                return None
            self._seen = stamp
            try:
                configuration = self._load()
            except (OSError, ValueError) as exc:
                log.error(
                    "TLS material in %s changed but does not load (%s); keeping the current",
                    self._paths.root,
                    exc,
                )
                return None
        log.info("TLS material in %s reloaded", self._paths.root)
        return configuration

    def _stamp(self) -> tuple[tuple[int, int], ...]:
        stats = [path.stat() for path in self._files]
        return tuple((stat.st_mtime_ns, stat.st_size) for stat in stats)

    def _load(self) -> Any:
        server = CertifiedKey.read(self._paths.server_cert, self._paths.server_key)
        return grpc.ssl_server_certificate_configuration(
            [(server.key_pem, server.cert_pem)],
            root_certificates=self._paths.ca_cert.read_bytes(),
        )


def check_bind_policy(host: str, *, tls: bool, insecure: bool) -> None:
    """Refuse plaintext on a non-loopback address unless --insecure; warn loudly with it."""
    if tls or is_loopback(host):
        return
    if not insecure:
        raise InsecureBindError(
            f"refusing to serve plaintext on {host!r}, which other machines can reach: "
            "run `fedrl-server init-tls --host NAME` for TLS, bind to 127.0.0.1, "
            "or pass --insecure if this network is trusted"
        )
    log.warning(
        "serving PLAINTEXT on %s (--insecure): anyone on the network can read the traffic "
        "and act as any participant",
        host,
    )


@dataclass(frozen=True)
class ServerTransport:
    """How the server listens and authenticates, decided once at start."""

    authenticator: Authenticator
    """Checks every call; its mode says how (mtls, token or insecure)."""
    credentials: grpc.ServerCredentials | None
    """TLS credentials for add_secure_port; None means add_insecure_port."""


def server_transport(
    host: str, paths: TlsPaths, *, token_auth: bool = False, insecure: bool = False
) -> ServerTransport:
    """TLS whenever the TLS folder has material, else plaintext where the bind policy allows it.

    ``insecure`` permits plaintext off loopback; it never turns TLS off when
    material exists, so a leftover flag cannot silently downgrade a server.
    ``token_auth`` selects one-way TLS plus tokens instead of client certificates.
    """
    if paths.has_server_material():
        mode = AuthMode.TOKEN if token_auth else AuthMode.MTLS
        credentials = server_credentials(paths, require_client_auth=mode is AuthMode.MTLS)
        return ServerTransport(Authenticator(mode=mode, paths=paths), credentials)
    if token_auth:
        raise TlsMaterialError(
            f"token authentication needs TLS, and {paths.root} has no TLS material: "
            "run `fedrl-server init-tls --host NAME` first"
        )
    check_bind_policy(host, tls=False, insecure=insecure)
    return ServerTransport(Authenticator(mode=AuthMode.INSECURE), None)
