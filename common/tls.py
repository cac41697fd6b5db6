"""TLS material for a session: its CA, the server certificate, participant bundles, their files.

Keys are ECDSA P-256: as strong as RSA-3072 for this use, with keys and
signatures a tenth of the size and handshakes several times cheaper.

A participant's identity lives in its certificate as a URI subject alternative
name, ``fedrl:participant:<percent-encoded UTF-8 id>``. That name is what the
server trusts: URIs are ASCII, so a Unicode id survives every TLS stack
unchanged, and no other certificate this CA signs carries one (the server
certificate has DNS/IP names only). The subject CN repeats the id for people
reading the certificate; X.509 caps CN at 64 characters, so a longer id is
shortened there and only there.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedrl.common.durable_files import write_atomically
from fedrl.common.identity import validate_participant_id

PARTICIPANT_URI_PREFIX = "fedrl:participant:"
"""Scheme and kind of the URI SAN that carries a participant id."""

CA_DAYS = 5 * 365
"""A session CA outlives many participant certificates; re-creating it invalidates every bundle."""
SERVER_DAYS = 825
"""The longest server-certificate lifetime the CA/Browser Forum rules ever allowed."""
PARTICIPANT_DAYS = 365
"""One year: a lost laptop stops working on its own even if nobody revokes it."""

_CLOCK_SKEW = dt.timedelta(minutes=5)
"""Certificates start this far in the past so a participant whose clock lags still connects."""
_CN_MAX = 64
"""X.509 upper bound for a common name (RFC 5280, ub-common-name)."""


class TlsMaterialError(ValueError):
    """A certificate, key or bundle is missing, malformed, or does not fit with the others."""


class CertifiedKey(NamedTuple):
    """A PEM certificate and the PEM (PKCS#8, unencrypted) private key that goes with it."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def read(cls, cert_path: Path, key_path: Path) -> CertifiedKey:
        """Load a pair from files, checking that the key belongs to the certificate."""
        pair = cls(_read(cert_path), _read(key_path))
        _check_key_matches(load_cert(pair.cert_pem), _load_key(pair.key_pem), str(cert_path))
        return pair


@dataclass(frozen=True)
class TlsPaths:
    """Where the server keeps its TLS material: one folder, ``<data-dir>/tls``."""

    root: Path
    """The TLS folder itself."""

    @classmethod
    def for_data_dir(cls, data_dir: Path) -> TlsPaths:
        """The TLS folder of a server data dir."""
        return cls(Path(data_dir) / "tls")

    @property
    def ca_cert(self) -> Path:
        """Session CA certificate; handed to every participant."""
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        """Session CA private key; never leaves the server host."""
        return self.root / "ca.key"

    @property
    def server_cert(self) -> Path:
        """Server certificate with the host names clients dial."""
        return self.root / "server.pem"

    @property
    def server_key(self) -> Path:
        """Server private key."""
        return self.root / "server.key"

    @property
    def revoked(self) -> Path:
        """Revoked certificate serials (JSON), re-read by the running server when it changes."""
        return self.root / "revoked.json"

    @property
    def tokens(self) -> Path:
        """SHA-256 hashes of participant tokens (JSON), re-read when it changes."""
        return self.root / "tokens.json"

    @property
    def issued(self) -> Path:
        """Every participant certificate issued (JSON), so a revocation can name all of them."""
        return self.root / "issued.json"

    @property
    def lock(self) -> Path:
        """Lock file serialising read-modify-write of the JSON records."""
        return self.root / ".lock"

    @property
    def bundles(self) -> Path:
        """Folder of participant bundles waiting to be handed over."""
        return self.root / "participants"

    def has_server_material(self) -> bool:
        """Whether the server can serve TLS (CA, server certificate and key all exist)."""
        return all(p.is_file() for p in (self.ca_cert, self.server_cert, self.server_key))


def create_ca(
    common_name: str, *, days: int = CA_DAYS, now: dt.datetime | None = None
) -> CertifiedKey:
    """A self-signed CA that may sign end-entity certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _short_cn(common_name))])
    start = _start(now)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertifiedKey(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_server_cert(
    ca: CertifiedKey,
    hosts: Sequence[str],
    *,
    days: int = SERVER_DAYS,
    now: dt.datetime | None = None,
) -> CertifiedKey:
    """A server certificate valid for each host name or IP address in ``hosts``."""
    if not hosts:
        raise TlsMaterialError("a server certificate needs at least one host name or IP address")
    names = [_host_san(h) for h in hosts]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _short_cn(hosts[0]))])
    return _issue(
        ca,
        subject,
        x509.SubjectAlternativeName(names),
        ExtendedKeyUsageOID.SERVER_AUTH,
        days=days,
        now=now,
    )


def issue_participant_cert(
    ca: CertifiedKey,
    participant_id: str,
    *,
    days: int = PARTICIPANT_DAYS,
    now: dt.datetime | None = None,
) -> CertifiedKey:
    """A client certificate whose identity is ``participant_id`` (see the module docstring)."""
    pid = validate_participant_id(participant_id)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _short_cn(pid))])
    san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier(participant_uri(pid))])
    return _issue(ca, subject, san, ExtendedKeyUsageOID.CLIENT_AUTH, days=days, now=now)


def participant_uri(participant_id: str) -> str:
    """The URI SAN naming a participant: ASCII whatever the id's script."""
    return PARTICIPANT_URI_PREFIX + urllib.parse.quote(participant_id, safe="")


def participant_id_from_cert(cert: x509.Certificate) -> str:
    """The participant a certificate names, from its URI SAN; TlsMaterialError if it names none."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise TlsMaterialError("certificate has no subject alternative name") from None
    uris = [
        u
        for u in san.get_values_for_type(x509.UniformResourceIdentifier)
        if u.startswith(PARTICIPANT_URI_PREFIX)
    ]
    if len(uris) != 1:
        raise TlsMaterialError(
            f"certificate must name exactly one participant ({PARTICIPANT_URI_PREFIX}...), "
            f"found {len(uris)}"
        )
    encoded = uris[0].removeprefix(PARTICIPANT_URI_PREFIX)
    try:
        raw = urllib.parse.unquote_to_bytes(encoded).decode("utf-8")
    except UnicodeDecodeError:
        raise TlsMaterialError("participant id in certificate is not valid UTF-8") from None
    pid = validate_participant_id(raw)
    if pid != raw:
        raise TlsMaterialError("participant id in certificate is not in normal form (NFC)")
    return pid


def load_cert(pem: bytes) -> x509.Certificate:
    """Parse one PEM certificate with a clear error."""
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise TlsMaterialError(f"not a PEM certificate: {exc}") from None


@dataclass(frozen=True)
class ParticipantBundle:
    """What the operator hands a participant: one PEM file with its certificate, key and the CA.

    One file rather than a folder because one file is what people manage to
    copy and keep together; the order inside is certificate, key, CA
    certificate, and the reader does not depend on it.
    """

    cert_pem: bytes
    """The participant's certificate."""
    key_pem: bytes
    """Its private key (PKCS#8, unencrypted: gRPC cannot read encrypted keys)."""
    ca_pem: bytes
    """The session CA certificate, to verify the server with."""

    def __post_init__(self) -> None:
        cert = load_cert(self.cert_pem)
        ca = load_cert(self.ca_pem)
        _check_key_matches(cert, _load_key(self.key_pem), "bundle certificate")
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            raise TlsMaterialError("bundle certificate was not issued by the bundle's CA") from None
        participant_id_from_cert(cert)

    @property
    def participant_id(self) -> str:
        """The id the certificate authenticates as."""
        return participant_id_from_cert(load_cert(self.cert_pem))

    def to_pem(self) -> bytes:
        """The bundle as one PEM file."""
        return b"".join(_ensure_newline(p) for p in (self.cert_pem, self.key_pem, self.ca_pem))

    @classmethod
    def from_pem(cls, data: bytes) -> ParticipantBundle:
        """Parse a bundle file: exactly one private key, one CA and one participant certificate."""
        try:
            certs = x509.load_pem_x509_certificates(data)
        except ValueError:
            raise TlsMaterialError("bundle holds no PEM certificate") from None
        leaves = [c for c in certs if not _is_ca(c)]
        cas = [c for c in certs if _is_ca(c)]
        if len(leaves) != 1 or len(cas) != 1:
            raise TlsMaterialError(
                "bundle must hold one participant certificate and one CA certificate, "
                f"found {len(leaves)} and {len(cas)}"
            )
        pem = serialization.Encoding.PEM
        return cls(
            cert_pem=leaves[0].public_bytes(pem),
            key_pem=_extract_key_block(data),
            ca_pem=cas[0].public_bytes(pem),
        )

    @classmethod
    def read(cls, path: Path) -> ParticipantBundle:
        """Load a bundle file."""
        try:
            return cls.from_pem(_read(path))
        except TlsMaterialError as exc:
            raise TlsMaterialError(f"{path}: {exc}") from None

    def write(self, path: Path) -> None:
        """Write the bundle as one private (0600) file."""
        write_private(path, self.to_pem())


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by the owner only, atomically: a crash leaves old or new, never half.

    The file is created 0600 before any byte lands in it, so a key is never
    readable by others even for an instant; the parent folder is created 0700.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomically(path, lambda file: file.write(data), mode=0o600)


def is_loopback(host: str) -> bool:
    """Whether a bind or dial host is reachable from this machine only.

    Literal addresses and the name "localhost" only: any other name could
    resolve anywhere, and a wildcard ("0.0.0.0", "::", "") means every interface.
    """
    bare = host.strip().strip("[]")
    if bare.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def _issue(
    ca: CertifiedKey,
    subject: x509.Name,
    san: x509.SubjectAlternativeName,
    usage: x509.ObjectIdentifier,
    *,
    days: int,
    now: dt.datetime | None,
) -> CertifiedKey:
    ca_cert = load_cert(ca.cert_pem)
    ca_key = _load_key(ca.key_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    start = _start(now)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(san, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return CertifiedKey(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _host_san(host: str) -> x509.GeneralName:
    """An IP address SAN for literal addresses, else a DNS SAN in its ASCII (IDNA) form."""
    bare = host.strip().strip("[]")
    if not bare:
        raise TlsMaterialError("empty host name")
    try:
        return x509.IPAddress(ipaddress.ip_address(bare))
    except ValueError:
        pass
    try:
        return x509.DNSName(bare.encode("idna").decode("ascii"))
    except UnicodeError:
        raise TlsMaterialError(f"not a valid host name or IP address: {host!r}") from None


def _start(now: dt.datetime | None) -> dt.datetime:
    return (now or dt.datetime.now(dt.UTC)) - _CLOCK_SKEW


def _short_cn(text: str) -> str:
    return text if len(text) <= _CN_MAX else text[: _CN_MAX - 1] + "…"


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsMaterialError(f"not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TlsMaterialError(f"expected an ECDSA private key, got {type(key).__name__}")
    return key


def _check_key_matches(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, what: str) -> None:
    if cert.public_key() != key.public_key():
        raise TlsMaterialError(f"{what}: private key does not belong to the certificate")


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _extract_key_block(data: bytes) -> bytes:
    """The one ``PRIVATE KEY`` PEM block of a bundle, verbatim."""
    begin, end = b"-----BEGIN PRIVATE KEY-----", b"-----END PRIVATE KEY-----"
    if data.count(begin) != 1 or data.count(end) != 1:
        raise TlsMaterialError("bundle must hold exactly one unencrypted PKCS#8 private key")
    start = data.index(begin)
    stop = data.index(end, start) + len(end)
    block = data[start:stop] + b"\n"
    _load_key(block)
    return block


def _ensure_newline(pem: bytes) -> bytes:
    return pem if pem.endswith(b"\n") else pem + b"\n"


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise TlsMaterialError(f"{path}: no such file") from None
