"""A session's bounded, durable store of experience batches: segment files + a SQLite index.

Batches are appended to segment files as records framed as
fedrl.server.storage.record_frames says (magic b"FXB3", numbered by batch id) and
indexed in SQLite; the index row is the commit point.
A payload is the batch header (with its column specs) and the encoded block,
as a pull sends them: serving a batch re-encodes it only to send it
uncompressed.
An append is acknowledged in this order: record written and fsynced ->
one transaction that drops evicted batches, adds the index row, the ack
row and the counters -> answer. So after `kill -9` at any moment:

- a record torn in the middle of its write has no index row: it is cut off
  at open, never served;
- a whole record whose transaction never committed is cut off the same way,
  and the client, which got no ack, sends it again;
- a committed batch is intact on disk (CRC-checked again on every read).

The cursor is the batch id: per session, strictly increasing and never
reused (ack rows outlive evicted batches and remember the largest id).

Bounds. The live records of a session stay within `max_bytes`; each
participant's within `participant_quota_bytes`, so one participant pushing
fast evicts its own oldest batches rather than everyone else's. Past either
limit the oldest batches go first. A segment file is deleted once all its
batches are evicted, so the disk holds at most one partly evicted segment
more than the cap.

Not thread-safe: one owner calls it (the service runs every store call on
one dedicated thread), so the index and the open segment never interleave.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError as ProtobufDecodeError

from fedrl.common.durable_files import fsync_directory
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.storage.record_frames import RecordFrames

log = logging.getLogger(__name__)

# A payload is a batch's columns as one block: header with column specs,
# block header, block bytes.
_FRAMES = RecordFrames(b"FXB3")
_LENGTH = struct.Struct("<I")
_SEGMENT_SUFFIX = ".seg"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS experience_batches (
    session TEXT NOT NULL,
    batch_id INTEGER NOT NULL,
    participant_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    segment INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL,
    transitions INTEGER NOT NULL,
    PRIMARY KEY (session, batch_id)
);
CREATE INDEX IF NOT EXISTS experience_batches_by_participant
    ON experience_batches (session, participant_id, batch_id);
CREATE TABLE IF NOT EXISTS experience_acks (
    session TEXT NOT NULL,
    participant_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    batch_id INTEGER NOT NULL,
    transitions INTEGER NOT NULL,
    received_ms INTEGER NOT NULL,
    PRIMARY KEY (session, participant_id, sequence)
);
CREATE TABLE IF NOT EXISTS experience_participants (
    session TEXT NOT NULL,
    participant_id TEXT NOT NULL,
    batches_accepted INTEGER NOT NULL DEFAULT 0,
    transitions_accepted INTEGER NOT NULL DEFAULT 0,
    batches_rejected INTEGER NOT NULL DEFAULT 0,
    batches_duplicate INTEGER NOT NULL DEFAULT 0,
    batches_evicted INTEGER NOT NULL DEFAULT 0,
    last_seen_ms INTEGER NOT NULL,
    PRIMARY KEY (session, participant_id)
);
"""


@dataclass(frozen=True)
class StoreConfig:
    """Bounds of one session's experience store."""

    max_bytes: int = 256 << 20
    """Live record bytes of the session; past it the oldest batches are evicted."""
    participant_quota_bytes: int = 64 << 20
    """Live record bytes of one participant; past it that participant's oldest go first."""
    segment_bytes: int = 16 << 20
    """A new segment file starts past this size; whole files are what eviction frees."""

    def __post_init__(self) -> None:
        for name in ("max_bytes", "participant_quota_bytes", "segment_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.participant_quota_bytes > self.max_bytes:
            raise ValueError(
                f"participant_quota_bytes ({self.participant_quota_bytes}) must not exceed "
                f"max_bytes ({self.max_bytes})"
            )


class StoreError(Exception):
    """A push the store refuses in its current state; the message says why."""


class SequenceError(StoreError):
    """A sequence number below the participant's newest that was never acknowledged."""


class BatchTooLargeError(StoreError):
    """One batch larger than a participant's quota could never be kept."""


@dataclass(frozen=True)
class Ack:
    """The answer to a push; a duplicate gets the first answer again."""

    sequence: int
    duplicate: bool
    transitions_stored: int


@dataclass(frozen=True)
class StoredBatch:
    """A batch as stored and served: header (cursor = batch id), block header, block bytes."""

    header: pb.ExperienceHeader
    """Who sent it, how it was made, its column specs; on read, cursor is the batch id."""
    block: tpb.TensorHeader
    """The header of the batch's one tensor, the encoded columns."""
    data: bytes
    """The encoded columns."""


@dataclass(frozen=True)
class PullResult:
    """Batches after a cursor and where the next pull continues."""

    batches: list[StoredBatch]
    next_cursor: int


@dataclass(frozen=True)
class _Row:
    batch_id: int
    participant_id: str
    segment: int
    offset: int
    length: int
    transitions: int


class ExperienceStore:
    """One session's experience: append with exactly-once, bounded, read after a cursor."""

    def __init__(
        self, *, directory: Path, db: sqlite3.Connection, session: str, config: StoreConfig
    ) -> None:
        """Open (or create) the store and repair what a crash left: see the module doc."""
        self._dir = directory
        self._db = db
        self._session = session
        self._config = config
        directory.mkdir(parents=True, exist_ok=True)
        db.executescript(_SCHEMA)
        self._recover()
        self._total, self._by_participant = self._usage()
        self._active = max(self._segments(), default=0)
        self._writer: BinaryIO | None = None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # Push.

    def last_sequence(self, participant_id: str) -> int:
        """The participant's newest acknowledged sequence number, 0 if none."""
        return last_acknowledged(self._db, self._session, participant_id)

    def find_ack(self, participant_id: str, sequence: int) -> Ack | None:
        """The stored answer of an earlier push of this sequence, None if there was none."""
        row = self._db.execute(
            "SELECT transitions FROM experience_acks "
            "WHERE session=? AND participant_id=? AND sequence=?",
            (self._session, participant_id, sequence),
        ).fetchone()
        if row is None:
            return None
        return Ack(sequence=sequence, duplicate=True, transitions_stored=int(row[0]))

    def answer_duplicate(self, participant_id: str, sequence: int, *, now_ms: int) -> Ack | None:
        """The first answer to a repeated push, counted as a duplicate; None for a new sequence."""
        known = self.find_ack(participant_id, sequence)
        if known is not None:
            self._bump(participant_id, "batches_duplicate", now_ms)
        return known

    def append(self, batch: StoredBatch, *, now_ms: int) -> Ack:
        """Store a validated batch once; a repeat of an acknowledged sequence is a duplicate.

        batch.header names the participant and sequence; its cursor is assigned here.
        """
        header = batch.header
        pid, sequence = header.participant_id, header.sequence
        known = self.answer_duplicate(pid, sequence, now_ms=now_ms)
        if known is not None:
            return known
        last = self.last_sequence(pid)
        if sequence <= last:
            raise SequenceError(
                f"sequence {sequence} is below the last acknowledged {last} and was never "
                "acknowledged; sequence numbers must increase"
            )
        batch_id = self._next_batch_id()
        stored = pb.ExperienceHeader()
        stored.CopyFrom(header)
        stored.session = self._session
        stored.cursor = batch_id
        record = _FRAMES.frame(_payload(stored, batch.block, batch.data), batch_id)
        if len(record) > self._config.participant_quota_bytes:
            raise BatchTooLargeError(
                f"batch takes {len(record)} bytes stored, more than the per-participant quota "
                f"of {self._config.participant_quota_bytes}; send smaller batches"
            )
        evicted = self._choose_evictions(pid, len(record))
        segment, offset = self._write(record)
        with self._transaction() as db:
            db.executemany(
                "DELETE FROM experience_batches WHERE session=? AND batch_id=?",
                [(self._session, row.batch_id) for row in evicted],
            )
            for row in evicted:
                self._bump_in(db, row.participant_id, "batches_evicted", now_ms)
            db.execute(
                "INSERT INTO experience_batches (session, batch_id, participant_id, sequence, "
                "segment, offset, length, transitions) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    self._session,
                    batch_id,
                    pid,
                    sequence,
                    segment,
                    offset,
                    len(record),
                    header.transitions,
                ),
            )
            db.execute(
                "INSERT INTO experience_acks (session, participant_id, sequence, batch_id, "
                "transitions, received_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (self._session, pid, sequence, batch_id, header.transitions, now_ms),
            )
            self._bump_in(db, pid, "batches_accepted", now_ms, transitions=header.transitions)
        for row in evicted:
            self._forget(row.participant_id, row.length)
        self._total += len(record)
        self._by_participant[pid] = self._by_participant.get(pid, 0) + len(record)
        self._delete_empty_segments({row.segment for row in evicted})
        return Ack(sequence=sequence, duplicate=False, transitions_stored=header.transitions)

    def count_rejection(self, participant_id: str, now_ms: int) -> None:
        """Count a refused batch against its participant."""
        self._bump(participant_id, "batches_rejected", now_ms)

    # Pull.

    def read_after(self, cursor: int, *, exclude: str, max_transitions: int) -> PullResult:
        """Other participants' batches after cursor, whole, while they fit the budget.

        The first batch is returned whole even if it alone exceeds the budget,
        so a caller with a small budget still moves forward and never skips a
        row (the cursor moves past whole batches only).
        A cursor past every id ever given (a store started afresh) comes back
        as the newest id, so the caller resynchronises instead of waiting forever.
        """
        newest = self._next_batch_id() - 1
        if cursor > newest:
            return PullResult([], newest)
        batches: list[StoredBatch] = []
        sent = 0
        position = cursor
        for row in self._rows_after(cursor, exclude):
            if batches and sent + row.transitions > max_transitions:
                return PullResult(batches, position)
            stored = self._read(row)
            if stored is not None:
                batches.append(stored)
                sent += row.transitions
            position = row.batch_id
            if sent >= max_transitions:
                return PullResult(batches, position)
        # Nothing more for this caller: its own batches after the last one sent are skipped too.
        return PullResult(batches, newest)

    # Accounting, for tests and status.

    @property
    def total_bytes(self) -> int:
        """Live record bytes of the session."""
        return self._total

    def participant_bytes(self, participant_id: str) -> int:
        """Live record bytes of one participant."""
        return self._by_participant.get(participant_id, 0)

    def counters(self, participant_id: str) -> dict[str, int]:
        """The participant's accepted, rejected, duplicate and evicted batch counts."""
        row = self._db.execute(
            "SELECT batches_accepted, transitions_accepted, batches_rejected, batches_duplicate, "
            "batches_evicted FROM experience_participants WHERE session=? AND participant_id=?",
            (self._session, participant_id),
        ).fetchone()
        names = ("accepted", "transitions", "rejected", "duplicate", "evicted")
        return dict(zip(names, row or (0, 0, 0, 0, 0), strict=True))

    # Internals: index.

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _next_batch_id(self) -> int:
        # Ack rows are never deleted, so the largest id survives eviction of its batch.
        row = self._db.execute(
            "SELECT MAX(batch_id) FROM experience_acks WHERE session=?", (self._session,)
        ).fetchone()
        return int(row[0]) + 1 if row[0] is not None else 1

    def _rows_after(self, cursor: int, exclude: str) -> Iterator[_Row]:
        query = (
            "SELECT batch_id, participant_id, segment, offset, length, transitions "
            "FROM experience_batches WHERE session=? AND batch_id>? AND participant_id<>? "
            "ORDER BY batch_id LIMIT 256"
        )
        while True:
            rows = self._db.execute(query, (self._session, cursor, exclude)).fetchall()
            if not rows:
                return
            for values in rows:
                yield _Row(*values)
            cursor = rows[-1][0]

    def _oldest(self, participant_id: str | None) -> Iterator[_Row]:
        """Live batches oldest first, of one participant or of everyone, a page at a time."""
        own = " AND participant_id=?" if participant_id is not None else ""
        query = (
            "SELECT batch_id, participant_id, segment, offset, length, transitions "
            f"FROM experience_batches WHERE session=? AND batch_id>?{own} "
            "ORDER BY batch_id LIMIT 256"
        )
        after = 0
        while True:
            params: tuple[str | int, ...] = (self._session, after)
            if participant_id is not None:
                params += (participant_id,)
            rows = self._db.execute(query, params).fetchall()
            if not rows:
                return
            for values in rows:
                yield _Row(*values)
            after = rows[-1][0]

    def _choose_evictions(self, participant_id: str, size: int) -> list[_Row]:
        """The oldest batches to drop so that a new record of `size` bytes fits both bounds."""
        chosen: dict[int, _Row] = {}
        over_quota = (
            self._by_participant.get(participant_id, 0)
            + size
            - self._config.participant_quota_bytes
        )
        if over_quota > 0:
            for row in self._oldest(participant_id):
                chosen[row.batch_id] = row
                over_quota -= row.length
                if over_quota <= 0:
                    break
        freed = sum(row.length for row in chosen.values())
        over_cap = self._total - freed + size - self._config.max_bytes
        if over_cap > 0:
            for row in self._oldest(None):
                if row.batch_id in chosen:
                    continue
                chosen[row.batch_id] = row
                over_cap -= row.length
                if over_cap <= 0:
                    break
        return list(chosen.values())

    def _forget(self, participant_id: str, length: int) -> None:
        self._total -= length
        left = self._by_participant[participant_id] - length
        if left:
            self._by_participant[participant_id] = left
        else:
            del self._by_participant[participant_id]

    def _usage(self) -> tuple[int, dict[str, int]]:
        rows = self._db.execute(
            "SELECT participant_id, SUM(length) FROM experience_batches WHERE session=? "
            "GROUP BY participant_id",
            (self._session,),
        ).fetchall()
        by_participant = {pid: int(total) for pid, total in rows}
        return sum(by_participant.values()), by_participant

    def _bump(self, participant_id: str, column: str, now_ms: int) -> None:
        with self._transaction() as db:
            self._bump_in(db, participant_id, column, now_ms)

    def _bump_in(
        self,
        db: sqlite3.Connection,
        participant_id: str,
        column: str,
        now_ms: int,
        *,
        transitions: int = 0,
    ) -> None:
        db.execute(
            "INSERT INTO experience_participants (session, participant_id, last_seen_ms) "
            "VALUES (?, ?, ?) ON CONFLICT (session, participant_id) DO NOTHING",
            (self._session, participant_id, now_ms),
        )
        db.execute(
            f"UPDATE experience_participants SET {column}={column}+1, "
            "transitions_accepted=transitions_accepted+?, last_seen_ms=MAX(last_seen_ms, ?) "
            "WHERE session=? AND participant_id=?",
            (transitions, now_ms, self._session, participant_id),
        )

    # Internals: segment files.

    def _segments(self) -> list[int]:
        return sorted(
            int(path.stem) for path in self._dir.glob(f"*{_SEGMENT_SUFFIX}") if path.stem.isdigit()
        )

    def _path(self, segment: int) -> Path:
        return self._dir / f"{segment:010d}{_SEGMENT_SUFFIX}"

    def _write(self, record: bytes) -> tuple[int, int]:
        """Append a record durably; returns (segment, offset)."""
        path = self._path(self._active) if self._active else None
        size = path.stat().st_size if path is not None and path.exists() else 0
        if path is None or (size and size + len(record) > self._config.segment_bytes):
            self.close()
            self._active += 1
            path, size = self._path(self._active), 0
        if self._writer is None:
            created = not path.exists()
            self._writer = path.open("ab")
            if created:
                fsync_directory(self._dir)
        self._writer.write(record)
        self._writer.flush()
        os.fsync(self._writer.fileno())
        return self._active, size

    def _read(self, row: _Row) -> StoredBatch | None:
        """A batch's record, checked; None (and its index row dropped) if it is damaged."""
        try:
            with self._path(row.segment).open("rb") as handle:
                handle.seek(row.offset)
                data = handle.read(row.length)
            payload = _FRAMES.payload(data, row.batch_id)
            if payload is None:
                raise ValueError("frame, batch id or checksum does not match")
            return _parse_payload(payload)
        except (OSError, ValueError, ProtobufDecodeError) as exc:
            log.error(
                "experience batch %d of session %r is damaged (%s); dropping it",
                row.batch_id,
                self._session,
                exc,
            )
            with self._transaction() as db:
                db.execute(
                    "DELETE FROM experience_batches WHERE session=? AND batch_id=?",
                    (self._session, row.batch_id),
                )
            self._forget(row.participant_id, row.length)
            return None

    def _recover(self) -> None:
        """Cut every segment back to its last committed record; drop files nothing indexes."""
        ends = dict(
            self._db.execute(
                "SELECT segment, MAX(offset + length) FROM experience_batches WHERE session=? "
                "GROUP BY segment",
                (self._session,),
            ).fetchall()
        )
        for segment in self._segments():
            path = self._path(segment)
            committed = int(ends.get(segment, 0))
            if committed == 0:
                path.unlink()
                continue
            intact, _, _ = _FRAMES.scan(path.read_bytes(), 0)
            if intact < committed:
                # Committed records are fsynced before their row: this is disk damage.
                log.error(
                    "experience segment %s is damaged after byte %d; dropping the batches past it",
                    path,
                    intact,
                )
                with self._transaction() as db:
                    db.execute(
                        "DELETE FROM experience_batches "
                        "WHERE session=? AND segment=? AND offset + length > ?",
                        (self._session, segment, intact),
                    )
                committed = intact
            if path.stat().st_size > committed:
                log.warning(
                    "experience segment %s: cutting %d bytes never committed (torn tail)",
                    path,
                    path.stat().st_size - committed,
                )
                with path.open("r+b") as handle:
                    handle.truncate(committed)
                    os.fsync(handle.fileno())

    def _delete_empty_segments(self, candidates: set[int]) -> None:
        for segment in candidates - {self._active}:
            row = self._db.execute(
                "SELECT 1 FROM experience_batches WHERE session=? AND segment=? LIMIT 1",
                (self._session, segment),
            ).fetchone()
            if row is None:
                self._path(segment).unlink(missing_ok=True)


def participant_counts(db: sqlite3.Connection, session: str) -> dict[str, tuple[int, int]]:
    """(batches accepted, batches rejected) of each participant of a session, for Status.

    Reads the store's tables through any connection to the server database
    (StateDB's too); empty while the experience service has never run there.
    """
    if not _has_store_tables(db):
        return {}
    rows = db.execute(
        "SELECT participant_id, batches_accepted, batches_rejected FROM experience_participants "
        "WHERE session=?",
        (session,),
    ).fetchall()
    return {pid: (int(accepted), int(rejected)) for pid, accepted, rejected in rows}


def last_acknowledged(db: sqlite3.Connection, session: str, participant_id: str) -> int:
    """The participant's newest acknowledged experience sequence (JoinReply), 0 if none."""
    if not _has_store_tables(db):
        return 0
    row = db.execute(
        "SELECT MAX(sequence) FROM experience_acks WHERE session=? AND participant_id=?",
        (session, participant_id),
    ).fetchone()
    return int(row[0]) if row[0] is not None else 0


def _has_store_tables(db: sqlite3.Connection) -> bool:
    row = db.execute(
        "SELECT COUNT(*) FROM sqlite_master WHERE type='table' "
        "AND name IN ('experience_participants', 'experience_acks')"
    ).fetchone()
    return int(row[0]) == 2


def _payload(header: pb.ExperienceHeader, block: tpb.TensorHeader, data: bytes) -> bytes:
    """The batch header and the block header, each length-prefixed, then the block bytes."""
    return b"".join(
        (
            _length_prefixed(header.SerializeToString()),
            _length_prefixed(block.SerializeToString()),
            data,
        )
    )


def _parse_payload(payload: bytes) -> StoredBatch:
    view = memoryview(payload)
    header_bytes, position = _read_prefixed(view, 0)
    block_bytes, position = _read_prefixed(view, position)
    block = tpb.TensorHeader.FromString(block_bytes)
    if len(view) - position != block.encoded_size:
        raise ValueError(
            f"record holds {len(view) - position} block bytes, its header says {block.encoded_size}"
        )
    return StoredBatch(
        header=pb.ExperienceHeader.FromString(header_bytes),
        block=block,
        data=bytes(view[position:]),
    )


def _length_prefixed(data: bytes) -> bytes:
    return _LENGTH.pack(len(data)) + data


def _read_prefixed(view: memoryview, position: int) -> tuple[bytes, int]:
    if position + _LENGTH.size > len(view):
        raise ValueError("record ends inside a length prefix")
    (length,) = _LENGTH.unpack_from(view, position)
    start = position + _LENGTH.size
    if start + length > len(view):
        raise ValueError("record ends inside a message")
    return bytes(view[start : start + length]), start + length
