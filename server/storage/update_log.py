"""Write-ahead log of acknowledged updates: durable before the ack, replayed after a crash.

An update is appended (written and fdatasync'ed) before the server answers
the push, and stays in the log until a committed global version has folded
it in. Appends that arrive while another is being written share the next
fdatasync (group commit): each caller returns once the sync covering its own
record is done, so N concurrent pushes cost one disk flush instead of N in a
row; after ``kill -9`` the server replays what the last committed version
did not include. Records carry everything needed to answer a repeated push
with its first answer (participant, sequence, base version, staleness, weight).

On-disk format (all integers little-endian). The directory holds segment
files ``{first_lsn:020d}.wal``, where first_lsn is the log sequence number
(LSN) of the segment's first record; LSNs start at 1 and rise by exactly one
per record, across segments and restarts (the newest segment is never
deleted, so its name carries the counter even when it holds no record). An
empty ``LOCK`` file is flock'ed while the log is open, so a second writer is
refused instead of interleaving records.

Segment header, 24 bytes::

    magic     8s   b"FEDRLWAL"
    format    u32  1
    first_lsn u64  equal to the file name's number
    crc       u32  CRC-32 of the 20 bytes above

Then records, back to back, framed as fedrl.server.storage.record_frames says
(magic b"FRec", the record's number is its LSN), each payload an update as
fedrl.server.storage.update_record encodes it.

Recovery at open: a record that is cut short or fails its CRC at the end of
the newest segment is what a crash during an append leaves; it was never
acknowledged, so it is logged and truncated away. Damage followed by an intact
record (or in an older segment) is not a torn write but lost data: opening
then fails with CorruptLogError instead of silently dropping acknowledged
updates; so does a segment header of another format, which is never
rewritten. A crash after the fdatasync but before the reply leaves a durable
record whose push was never answered: replay yields it like any other, and
the participant's retry must get it as the first answer.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from fedrl.common.durable_files import datasync, fsync_directory, lock_directory, write_all
from fedrl.server.storage.record_frames import FRAME_HEADER_SIZE, MAX_PAYLOAD, RecordFrames
from fedrl.server.storage.update_record import (
    LoggedUpdate,
    RecordDecodeError,
    UnreadableRecord,
    decode_update,
    encode_update,
)

_log = logging.getLogger(__name__)

_SEGMENT_NAME = re.compile(r"(\d{20})\.wal")
_LOCK_FILE = "LOCK"
_SEGMENT_MAGIC = b"FEDRLWAL"
_FORMAT = 1
_SEGMENT_HEAD = struct.Struct("<8sIQ")
_SEGMENT_HEADER_SIZE = _SEGMENT_HEAD.size + 4
_FRAMES = RecordFrames(b"FRec")
_U32 = struct.Struct("<I")


class UpdateLogError(RuntimeError):
    """The log cannot be used: closed, or a failed fsync left its state unknown."""


class CorruptLogError(UpdateLogError):
    """The log holds damaged data that is not a torn tail; acknowledged updates may be lost."""


def _readable(records: Iterator[LoggedUpdate | UnreadableRecord]) -> Iterator[LoggedUpdate]:
    for record in records:
        if isinstance(record, UnreadableRecord):
            raise CorruptLogError(record.reason)
        yield record


@dataclass
class _Segment:
    first_lsn: int
    path: Path


@dataclass(eq=False)
class _Queued:
    """One encoded record waiting for the group write that makes it durable."""

    payload: bytes
    payload_crc: int
    lsn: int = 0
    """Set once the record is durable."""
    error: BaseException | None = None
    """Set when the write or sync meant to cover the record failed."""


class UpdateLog:
    """Append-only, fsync'ed, segmented log of updates; one writer, thread-safe.

    Two locks: `_lock` guards the state readers see (last LSN, segment list,
    the queue of records to write); `_write_lock` is held by the one thread
    writing a group of records, so file I/O never blocks readers or callers
    queueing the next group.
    """

    def __init__(self, directory: Path, *, segment_bytes: int = 64 << 20) -> None:
        """Open the log in `directory` (created if missing), repairing a torn tail."""
        if segment_bytes < _SEGMENT_HEADER_SIZE + FRAME_HEADER_SIZE:
            raise ValueError(f"segment_bytes is too small to hold a record: {segment_bytes}")
        self._directory = Path(directory)
        self._segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._queue: list[_Queued] = []
        self._failure: str | None = None
        self._directory.mkdir(parents=True, exist_ok=True)
        try:
            self._lock_fd = lock_directory(self._directory / _LOCK_FILE)
        except BlockingIOError:
            raise UpdateLogError(
                f"update log {self._directory} is open elsewhere (another server process, or "
                "an UpdateLog not closed); one writer only"
            ) from None
        try:
            self._segments, self._last_lsn = self._recover()
            active = self._segments[-1].path
            self._fd = os.open(active, os.O_WRONLY)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._size = active.stat().st_size
        self._records_in_active = self._last_lsn >= self._segments[-1].first_lsn

    @property
    def last_lsn(self) -> int:
        """LSN of the newest durable record; 0 for a log that never held one."""
        with self._lock:
            return self._last_lsn

    @property
    def directory(self) -> Path:
        """Where the segment files live."""
        return self._directory

    def append(
        self,
        *,
        session: str,
        participant_id: str,
        sequence: int,
        base_version: int,
        samples: int,
        env_steps: int,
        episodes: int,
        weight: float,
        staleness: int,
        metrics: Mapping[str, float],
        tensors: Sequence[tuple[str, np.ndarray]],
        received_unix_ms: int | None = None,
    ) -> LoggedUpdate:
        """Write one update durably; returns it with its LSN once it survives a power loss.

        Encoding runs before any lock, so concurrent callers overlap their CPU
        work with another's fsync; the write itself is grouped with every
        other record queued meanwhile (see _write_queued). received_unix_ms
        defaults to now. The returned record shares the given float32 arrays
        (no 4 MB copy per push), so they must not be changed afterwards.
        """
        received = time.time_ns() // 1_000_000 if received_unix_ms is None else received_unix_ms
        payload, update = encode_update(
            session=session,
            participant_id=participant_id,
            sequence=sequence,
            base_version=base_version,
            samples=samples,
            env_steps=env_steps,
            episodes=episodes,
            weight=weight,
            staleness=staleness,
            metrics=metrics,
            tensors=tensors,
            received_unix_ms=received,
        )
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(
                f"an update of {len(payload)} bytes does not fit one log record "
                f"(at most {MAX_PAYLOAD})"
            )
        record = _Queued(payload, zlib.crc32(payload))
        with self._lock:
            self._check_usable()
            self._queue.append(record)
        # Whoever holds the write lock writes everything queued by then; a
        # caller whose record went out in another's group finds it done here.
        with self._write_lock:
            if not record.lsn and record.error is None:
                self._write_queued(record)
        if record.error is not None:
            raise UpdateLogError(
                f"update log {self._directory}: the write meant to make this update "
                f"durable failed: {record.error}"
            ) from record.error
        return dataclasses.replace(update, lsn=record.lsn)

    def replay(self, after_lsn: int) -> Iterator[LoggedUpdate]:
        """Durable records with lsn > after_lsn, in LSN order, as of this call.

        Records already discarded are gone; a record damaged since open, or
        one whose intact frame does not decode, raises CorruptLogError rather
        than being yielded.
        """
        return _readable(self.replay_records(after_lsn))

    def replay_records(self, after_lsn: int) -> Iterator[LoggedUpdate | UnreadableRecord]:
        """As replay, but a frame that passes its CRC and does not decode comes as an
        UnreadableRecord (its bytes and why), so recovery can set it aside and go on."""
        with self._lock:
            self._check_open()
            last = self._last_lsn
            ends = [s.first_lsn - 1 for s in self._segments[1:]] + [last]
            wanted = [s for s, end in zip(self._segments, ends, strict=True) if end > after_lsn]
        return self._replay(wanted, after_lsn, last)

    def discard_through(self, lsn: int) -> int:
        """Delete whole segments whose records all have LSN <= lsn; return how many.

        Call once a committed version has folded those records in. The newest
        segment is kept whatever it holds: it carries the LSN counter.
        """
        with self._lock:
            self._check_open()
            deleted = 0
            # Oldest first, so a crash midway leaves a contiguous tail of segments.
            while len(self._segments) > 1 and self._segments[1].first_lsn - 1 <= lsn:
                self._segments.pop(0).path.unlink(missing_ok=True)
                deleted += 1
            if deleted:
                fsync_directory(self._directory)
            return deleted

    def close(self) -> None:
        """Release the files and the directory lock; appends after this raise UpdateLogError."""
        with self._write_lock, self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                os.close(self._lock_fd)
                self._fd = -1

    def __enter__(self) -> UpdateLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Writing ---------------------------------------------------------------

    def _write_queued(self, own: _Queued) -> None:
        """Write and sync every queued record; the caller holds the write lock.

        LSNs are given here, in queue order, so a failed write consumes none:
        the records of a failed group get an error and later appends carry on
        from the last durable LSN, as they would after a single failed append.
        The caller's own failure is raised as is; the others see it through
        their record's error.
        """
        with self._lock:
            group, self._queue = self._queue, []
            try:
                self._check_usable()
            except UpdateLogError as error:
                _fail(group, error, own)
                return
        lsn = self._last_lsn
        index = 0
        while index < len(group):
            # One run per segment: records up to the segment's size, at least one.
            frames: list[bytes] = []
            run_start = index
            start, had_records = self._size, self._records_in_active
            try:
                while index < len(group):
                    payload = group[index].payload
                    frame_size = FRAME_HEADER_SIZE + len(payload)
                    if self._records_in_active and self._size + frame_size > self._segment_bytes:
                        if frames:
                            break
                        self._roll(lsn + 1)
                        start, had_records = self._size, False
                    lsn += 1
                    frames += [_FRAMES.header(len(payload), lsn, group[index].payload_crc), payload]
                    self._size += frame_size
                    self._records_in_active = True
                    index += 1
                self._write_durably(frames, start)
            except BaseException as error:
                # As if the run had never been written (its bytes were cut off).
                self._size, self._records_in_active = start, had_records
                _fail(group[run_start:], error, own)
                return
            with self._lock:
                self._last_lsn = lsn
            for offset, record in enumerate(group[run_start:index]):
                record.lsn = lsn - (index - run_start) + 1 + offset

    def _write_durably(self, frames: list[bytes], start: int) -> None:
        """Write frames at `start` in the active segment and fdatasync them."""
        position = start
        try:
            for frame in frames:
                write_all(self._fd, frame, position)
                position += len(frame)
        except OSError:
            # Cut the partial frames off, or the next record would follow garbage.
            try:
                os.ftruncate(self._fd, start)
            except OSError as error:
                self._failure = f"could not undo a failed write: {error}"
            raise
        try:
            datasync(self._fd)
        except OSError as error:
            # After a failed fsync the kernel may have dropped the dirty pages;
            # nothing written since can be trusted until a reopen rescans.
            self._failure = f"fdatasync failed: {error}"
            raise

    def _roll(self, first_lsn: int) -> None:
        """Start a new segment whose first record will have `first_lsn`."""
        path = self._directory / _segment_name(first_lsn)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, _segment_header(first_lsn), 0)
            datasync(fd)
            fsync_directory(self._directory)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(self._fd)
        self._fd = fd
        self._size = _SEGMENT_HEADER_SIZE
        self._records_in_active = False
        with self._lock:
            self._segments.append(_Segment(first_lsn, path))

    def _check_open(self) -> None:
        if self._fd < 0:
            raise UpdateLogError(f"update log {self._directory} is closed")

    def _check_usable(self) -> None:
        self._check_open()
        if self._failure is not None:
            raise UpdateLogError(
                f"update log {self._directory} refuses appends: {self._failure}; "
                "restart the server to recover from what is on disk"
            )

    # Reading ---------------------------------------------------------------

    def _replay(
        self, segments: list[_Segment], after_lsn: int, last_lsn: int
    ) -> Iterator[LoggedUpdate | UnreadableRecord]:
        for segment in segments:
            try:
                file = open(segment.path, "rb")  # noqa: SIM115 - closed below, across yields
            except FileNotFoundError:
                # Discarded since the snapshot: its records are in a committed version.
                continue
            with file:
                _read_segment_header(file, segment)
                lsn = segment.first_lsn
                while lsn <= last_lsn:
                    payload = _read_frame(file, segment, lsn)
                    if payload is None:
                        break
                    if lsn > after_lsn:
                        try:
                            yield decode_update(payload, lsn)
                        except RecordDecodeError as error:
                            reason = f"{segment.path}: record {lsn} does not decode: {error}"
                            yield UnreadableRecord(lsn, payload, reason)
                    lsn += 1

    def _recover(self) -> tuple[list[_Segment], int]:
        """Scan every segment, truncate a torn tail, check LSN continuity."""
        segments = sorted(
            (
                _Segment(int(m[1]), self._directory / m[0])
                for m in (_SEGMENT_NAME.fullmatch(p.name) for p in self._directory.iterdir())
                if m
            ),
            key=lambda s: s.first_lsn,
        )
        if not segments:
            return [self._create_first_segment()], 0
        previous_last: int | None = None
        for index, segment in enumerate(segments):
            if segment.first_lsn < 1:
                raise CorruptLogError(f"{segment.path}: segment names LSN 0; LSNs start at 1")
            if previous_last is not None and segment.first_lsn != previous_last + 1:
                raise CorruptLogError(
                    f"{segment.path}: starts at LSN {segment.first_lsn} but the previous "
                    f"segment ends at {previous_last}; records are missing"
                )
            data = segment.path.read_bytes()
            scan = _scan(data, segment)
            newest = index == len(segments) - 1
            if scan.damage is not None:
                if not newest or _FRAMES.intact_after(data, scan.valid_end):
                    raise CorruptLogError(
                        f"{segment.path}: damaged at byte {scan.valid_end} ({scan.damage}) "
                        "with data after it; this is not a torn write. Acknowledged updates "
                        "may be lost: keep a copy of the directory and inspect it"
                    )
                self._truncate_tail(segment, scan, len(data))
            previous_last = scan.last_lsn
        return segments, previous_last if previous_last is not None else 0

    def _truncate_tail(self, segment: _Segment, scan: _Scan, size: int) -> None:
        _log.warning(
            "update log %s: dropping %d bytes of a torn, unacknowledged tail at byte %d (%s)",
            segment.path,
            size - scan.valid_end,
            scan.valid_end,
            scan.damage,
        )
        with open(segment.path, "r+b") as file:
            if scan.valid_end == 0:
                # The crash hit while the segment was being created; its name
                # still says where the LSNs go on.
                file.write(_segment_header(segment.first_lsn))
                end = _SEGMENT_HEADER_SIZE
            else:
                end = scan.valid_end
            file.truncate(end)
            file.flush()
            os.fsync(file.fileno())

    def _create_first_segment(self) -> _Segment:
        segment = _Segment(1, self._directory / _segment_name(1))
        with open(segment.path, "xb") as file:
            file.write(_segment_header(1))
            file.flush()
            os.fsync(file.fileno())
        fsync_directory(self._directory)
        return segment


@dataclass(frozen=True)
class _Scan:
    """What a scan of one segment found."""

    last_lsn: int
    """LSN of the last intact record (first_lsn - 1 when none)."""
    valid_end: int
    """Byte offset just past the last intact structure (0 when the header is bad)."""
    damage: str | None
    """Why the scan stopped before the end of the file, or None."""


def _scan(data: bytes, segment: _Segment) -> _Scan:
    """Walk a segment's records, checking magic, bounds, LSN order and CRC."""
    problem = _check_segment_header(data, segment)
    if problem is not None:
        return _Scan(segment.first_lsn - 1, 0, problem)
    end, count, problem = _FRAMES.scan(data, _SEGMENT_HEADER_SIZE, segment.first_lsn)
    return _Scan(segment.first_lsn + count - 1, end, problem)


def _check_segment_header(data: bytes, segment: _Segment) -> str | None:
    """None for a good header, why for a torn one; CorruptLogError for a foreign one.

    A header that passes its CRC but is not ours (another format, a renamed
    file) is never repaired: rewriting it could erase a newer server's log.
    """
    if len(data) < _SEGMENT_HEADER_SIZE:
        return "segment header cut short"
    head = data[: _SEGMENT_HEAD.size]
    (crc,) = _U32.unpack_from(data, _SEGMENT_HEAD.size)
    if zlib.crc32(head) != crc:
        return "segment header fails its CRC"
    magic, version, lsn = _SEGMENT_HEAD.unpack(head)
    if magic != _SEGMENT_MAGIC or version != _FORMAT:
        raise CorruptLogError(
            f"{segment.path}: not an update log segment of format {_FORMAT} "
            f"(magic {magic!r}, format {version}); was it written by another fedrl version?"
        )
    if lsn != segment.first_lsn:
        raise CorruptLogError(
            f"{segment.path}: header says first LSN {lsn}, the file name {segment.first_lsn}; "
            "segment files must not be renamed"
        )
    return None


def _read_segment_header(file: BinaryIO, segment: _Segment) -> None:
    problem = _check_segment_header(file.read(_SEGMENT_HEADER_SIZE), segment)
    if problem is not None:
        raise CorruptLogError(f"{segment.path}: {problem} (changed since the log was opened)")


def _read_frame(file: BinaryIO, segment: _Segment, lsn: int) -> bytes | None:
    """The payload of record `lsn`; None at the end of the file."""
    try:
        return _FRAMES.read(file, lsn)
    except ValueError as error:
        raise CorruptLogError(
            f"{segment.path}: record {lsn}: {error} (changed since the log was opened)"
        ) from None


def _fail(records: Sequence[_Queued], error: BaseException, own: _Queued) -> None:
    """Give each record the error; re-raise it for the caller whose record is among them."""
    for record in records:
        record.error = error
    if own in records:
        own.error = None
        raise error


def _segment_name(first_lsn: int) -> str:
    return f"{first_lsn:020d}.wal"


def _segment_header(first_lsn: int) -> bytes:
    head = _SEGMENT_HEAD.pack(_SEGMENT_MAGIC, _FORMAT, first_lsn)
    return head + _U32.pack(zlib.crc32(head))
