"""The outbox's entry files (fedrl.client.federation.outbox): one unacknowledged stream a file.

The format (no pickle: unpickling runs code) is the magic b"FEDRLOB1",
then records, each a little-endian u32 length, u32 CRC-32 and that many
bytes. Record 0 is UTF-8 JSON metadata ({"format", "kind", "sequence",
"messages", "merged_through"}); records 1..messages are the serialized
protobuf messages of the stream exactly as they go on the wire (UpdateChunk:
header first, then the tensor chunks). A file is written to a dot-prefixed
temp name, fsynced, renamed into place and the directory fsynced, so a crash
leaves either the whole entry or a temp file, which the next open deletes
(it was never acknowledged by anything and its sequence is burnt, not
reused). A file that fails its magic, length or CRC checks anyway (a disk
fault, a copy cut short) is reported and moved to quarantine/, never sent.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("update", "experience")
MAGIC = b"FEDRLOB1"
FORMAT = 1
_RECORD = struct.Struct("<II")
SEQUENCE_DIGITS = 20
READY, SENT = ".ready", ".sent"


class OutboxError(ValueError):
    """An entry file that cannot be trusted, or a misuse of the outbox."""


@dataclass(frozen=True)
class Entry:
    """One unacknowledged stream of messages."""

    kind: str
    sequence: int
    messages: tuple[bytes, ...]
    """Serialized protobuf messages, exactly as they go on the wire."""
    attempted: bool
    """True once a send may have started; such an entry is never changed."""
    merged_through: int
    """Highest sequence folded into this entry (its own when never merged)."""
    size: int
    """Bytes of its file."""


def entry_name(kind: str, sequence: int, state: str) -> str:
    """The file name of entry `sequence` of `kind` in `state` (READY or SENT)."""
    return f"{kind}-{sequence:0{SEQUENCE_DIGITS}d}{state}"


def encode_entry(
    kind: str, sequence: int, messages: tuple[bytes, ...], merged_through: int
) -> bytes:
    """An entry file's bytes: the magic, the metadata record, one record per message."""
    meta = {
        "format": FORMAT,
        "kind": kind,
        "sequence": sequence,
        "messages": len(messages),
        "merged_through": merged_through,
    }
    records = [json.dumps(meta).encode("utf-8"), *messages]
    return MAGIC + b"".join(_record(r) for r in records)


def _record(payload: bytes) -> bytes:
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


def read_entry(path: Path) -> Entry:
    """The entry in the file at `path`; OutboxError if its bytes cannot be trusted."""
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        raise OutboxError("not an outbox entry (bad magic)")
    records: list[bytes] = []
    offset = len(MAGIC)
    while offset < len(data):
        if offset + _RECORD.size > len(data):
            raise OutboxError(f"torn record header at byte {offset}")
        length, crc = _RECORD.unpack_from(data, offset)
        offset += _RECORD.size
        payload = data[offset : offset + length]
        if len(payload) != length:
            raise OutboxError(f"record {len(records)} cut short: {len(payload)} of {length} bytes")
        if zlib.crc32(payload) != crc:
            raise OutboxError(f"record {len(records)} fails its CRC")
        records.append(payload)
        offset += length
    if not records:
        raise OutboxError("no metadata record")
    try:
        meta: dict[str, Any] = json.loads(records[0].decode("utf-8"))
        kind, sequence = str(meta["kind"]), int(meta["sequence"])
        count, merged_through = int(meta["messages"]), int(meta["merged_through"])
        version = int(meta["format"])
    except (ValueError, KeyError, TypeError) as exc:
        raise OutboxError(f"bad metadata: {exc}") from None
    if version != FORMAT:
        raise OutboxError(f"format {version}, this version reads {FORMAT}")
    if kind not in KINDS or path.name.split("-", 1)[0] != kind:
        raise OutboxError(f"kind {kind!r} does not match the file name")
    if sequence_from_name(path) != sequence or merged_through < sequence:
        raise OutboxError(f"sequence {sequence} does not match the file name")
    if count != len(records) - 1:
        raise OutboxError(f"holds {len(records) - 1} of its {count} messages")
    return Entry(kind, sequence, tuple(records[1:]), path.suffix == SENT, merged_through, len(data))


def sequence_from_name(path: Path) -> int | None:
    """The sequence an entry's file name carries, or None if it carries none."""
    _, _, digits = path.stem.partition("-")
    return int(digits) if digits.isdigit() else None


def check_kind(kind: str) -> None:
    """OutboxError unless `kind` is one of KINDS."""
    if kind not in KINDS:
        raise OutboxError(f"unknown outbox kind {kind!r}; one of {', '.join(KINDS)}")
