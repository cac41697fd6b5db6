"""TLS material: certificates carry the right identity and names; bundles and files are safe."""

from __future__ import annotations

import ipaddress
import stat
import unicodedata
from pathlib import Path

import pytest
from cryptography import x509

from fedrl.common.tls import (
    CertifiedKey,
    ParticipantBundle,
    TlsMaterialError,
    create_ca,
    is_loopback,
    issue_participant_cert,
    issue_server_cert,
    load_cert,
    participant_id_from_cert,
    participant_uri,
    write_private,
)


@pytest.fixture(scope="module")
def ca() -> CertifiedKey:
    return create_ca("test CA")


def test_participant_certificate_carries_the_unicode_id(ca: CertifiedKey) -> None:
    pair = issue_participant_cert(ca, "Макар")

    cert = load_cert(pair.cert_pem)

    assert participant_id_from_cert(cert) == "Макар"
    cn = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    assert cn == "Макар"
    assert participant_uri("Макар").isascii()


def test_participant_id_is_stored_in_normal_form(ca: CertifiedKey) -> None:
    decomposed = unicodedata.normalize("NFD", "Zoë")

    pair = issue_participant_cert(ca, decomposed)

    assert participant_id_from_cert(load_cert(pair.cert_pem)) == unicodedata.normalize("NFC", "Zoë")


def test_invalid_participant_id_is_refused_with_a_reason(ca: CertifiedKey) -> None:
    with pytest.raises(ValueError, match="must not contain '/'"):
        issue_participant_cert(ca, "a/b")


def test_server_certificate_names_ips_and_idna_hosts(ca: CertifiedKey) -> None:
    pair = issue_server_cert(ca, ["127.0.0.1", "[::1]", "fedrl.example.org", "bücher.example"])

    san = load_cert(pair.cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)

    ips = san.value.get_values_for_type(x509.IPAddress)
    dns = san.value.get_values_for_type(x509.DNSName)
    assert ips == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    assert dns == ["fedrl.example.org", "xn--bcher-kva.example"]


def test_server_certificate_does_not_pass_as_a_participant(ca: CertifiedKey) -> None:
    pair = issue_server_cert(ca, ["localhost"])

    with pytest.raises(TlsMaterialError, match="exactly one participant"):
        participant_id_from_cert(load_cert(pair.cert_pem))


def test_server_certificate_needs_a_host(ca: CertifiedKey) -> None:
    with pytest.raises(TlsMaterialError, match="at least one host"):
        issue_server_cert(ca, [])


def test_bundle_round_trips_through_one_private_file(ca: CertifiedKey, tmp_path: Path) -> None:
    pair = issue_participant_cert(ca, "Макар")
    bundle = ParticipantBundle(cert_pem=pair.cert_pem, key_pem=pair.key_pem, ca_pem=ca.cert_pem)
    path = tmp_path / "Макар.pem"

    bundle.write(path)
    loaded = ParticipantBundle.read(path)

    assert loaded == bundle
    assert loaded.participant_id == "Макар"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_bundle_with_a_key_of_another_certificate_is_refused(ca: CertifiedKey) -> None:
    mine = issue_participant_cert(ca, "Макар")
    theirs = issue_participant_cert(ca, "Иван")

    with pytest.raises(TlsMaterialError, match="does not belong"):
        ParticipantBundle(cert_pem=mine.cert_pem, key_pem=theirs.key_pem, ca_pem=ca.cert_pem)


def test_bundle_whose_certificate_another_ca_signed_is_refused(ca: CertifiedKey) -> None:
    foreign = issue_participant_cert(create_ca("other"), "Макар")

    with pytest.raises(TlsMaterialError, match="not issued by the bundle's CA"):
        ParticipantBundle(cert_pem=foreign.cert_pem, key_pem=foreign.key_pem, ca_pem=ca.cert_pem)


def test_bundle_file_without_a_key_is_refused_with_its_path(
    ca: CertifiedKey, tmp_path: Path
) -> None:
    pair = issue_participant_cert(ca, "Макар")
    path = tmp_path / "bundle.pem"
    path.write_bytes(pair.cert_pem + ca.cert_pem)

    with pytest.raises(TlsMaterialError, match=r"bundle\.pem: .*private key"):
        ParticipantBundle.read(path)


def test_write_private_replaces_atomically_with_owner_only_mode(tmp_path: Path) -> None:
    path = tmp_path / "tls" / "ca.key"
    write_private(path, b"old")

    write_private(path, b"new")

    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["ca.key"]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("fedrl.example.org", False),
    ],
)
def test_only_literal_loopback_hosts_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
