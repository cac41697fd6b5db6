"""Credential records in the TLS folder: none lost to concurrent commands, no secret stored."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest

from fedrl.common.tls import TlsMaterialError, TlsPaths, create_ca, issue_participant_cert
from fedrl.server.security.auth import issue_token, record_issued, revoke


def test_concurrent_issues_are_all_recorded_and_all_revocable(tmp_path: Path) -> None:
    paths = TlsPaths.for_data_dir(tmp_path)
    ca = create_ca("CA")
    certs = [issue_participant_cert(ca, "Макар").cert_pem for _ in range(8)]
    threads = [threading.Thread(target=record_issued, args=(paths, "Макар", c)) for c in certs]

    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = revoke(paths, "Макар")

    assert len(done.serials) == 8


def test_token_is_stored_only_as_its_sha256(tmp_path: Path) -> None:
    paths = TlsPaths.for_data_dir(tmp_path)

    token = issue_token(paths, "Макар")

    raw = paths.tokens.read_text(encoding="utf-8")
    assert token not in raw
    assert json.loads(raw)["tokens"] == [
        {
            "participant_id": "Макар",
            "sha256": hashlib.sha256(token.encode()).hexdigest(),
            "issued_unix": json.loads(raw)["tokens"][0]["issued_unix"],
        }
    ]


def test_revoking_twice_reports_nothing_new(tmp_path: Path) -> None:
    paths = TlsPaths.for_data_dir(tmp_path)
    ca = create_ca("CA")
    record_issued(paths, "Макар", issue_participant_cert(ca, "Макар").cert_pem)
    issue_token(paths, "Макар")
    first = revoke(paths, "Макар")

    second = revoke(paths, "Макар")

    assert (len(first.serials), first.tokens) == (1, 1)
    assert (second.serials, second.tokens) == ((), 0)


@pytest.mark.parametrize(
    "damaged",
    [
        '{"version": 1, "certificates": 5}',
        '[{"version": 1}]',
        '{"version": 1, "certificates": [{"participant_id": "Макар"}]}',
        '{"version": 2, "certificates": []}',
        "{not json",
    ],
)
def test_damaged_record_file_is_reported_with_its_path_and_never_overwritten(
    tmp_path: Path, damaged: str
) -> None:
    paths = TlsPaths.for_data_dir(tmp_path)
    paths.root.mkdir()
    paths.issued.write_text(damaged, encoding="utf-8")

    with pytest.raises(TlsMaterialError, match=r"issued\.json"):
        revoke(paths, "Макар")

    assert paths.issued.read_text(encoding="utf-8") == damaged
