"""Participant ids: Unicode names that are safe everywhere they go.

An id such as "Макар" ends up in file names, certificates, SQLite rows, logs
and gRPC metadata. It is normalised to NFC (so the same name typed two ways is
one participant) and refused if it could not be a file name on common
systems. Plain gRPC metadata values are ASCII-only, so the id travels in the
binary header "fedrl-participant-bin" as UTF-8.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

MAX_ID_CHARS = 64
METADATA_KEY = "fedrl-participant-bin"

# Characters that are path separators or reserved in file names on Windows
# or macOS: an id must be usable as a directory name wherever a participant runs.
_FORBIDDEN = set('/\\:*?"<>|')
# Control, format, separator and unassigned characters are invisible or
# ambiguous in logs and tables.
_FORBIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def validate_participant_id(raw: str) -> str:
    """Return the NFC form of raw, or raise ValueError saying what is wrong with it."""
    if not isinstance(raw, str):
        raise ValueError("participant id must be text")
    pid = unicodedata.normalize("NFC", raw)
    if not pid:
        raise ValueError("participant id must not be empty")
    if len(pid) > MAX_ID_CHARS:
        raise ValueError(f"participant id must be at most {MAX_ID_CHARS} characters")
    if pid != pid.strip():
        raise ValueError("participant id must not start or end with whitespace")
    if pid.startswith("."):
        raise ValueError("participant id must not start with '.'")
    for char in pid:
        if char in _FORBIDDEN:
            raise ValueError(f"participant id must not contain {char!r}")
        if unicodedata.category(char) in _FORBIDDEN_CATEGORIES:
            raise ValueError(
                f"participant id must not contain the invisible character U+{ord(char):04X}"
            )
    return pid


def safe_dirname(pid: str) -> str:
    """The directory name for a participant's files: the validated id itself."""
    return validate_participant_id(pid)


def id_to_metadata(pid: str) -> tuple[str, bytes]:
    """The (key, value) metadata pair that carries pid over gRPC."""
    return METADATA_KEY, validate_participant_id(pid).encode("utf-8")


def id_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The participant id in gRPC metadata, or None; ValueError if it is malformed."""
    for key, value in metadata or ():
        if key != METADATA_KEY:
            continue
        if isinstance(value, str):
            raise ValueError(f"{METADATA_KEY} must be binary metadata")
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{METADATA_KEY} is not valid UTF-8") from None
        return validate_participant_id(text)
    return None
