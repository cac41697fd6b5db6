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
(magic b"FRec", the record's number is its LSN), each payload holding::

      base_version i64, sequence u64, samples u64, env_steps u64, episodes u64,
      weight f64, staleness u32, received_unix_ms i64,
      session, participant_id, metrics: each u32 byte count + UTF-8
        (metrics is a JSON object of name -> number),
      tensor count u32, then per tensor:
        name (u32 byte count + UTF-8), encoding u8, ndim u8, shape u64 x ndim,
        data byte count u64, data.

Tensors are float32 deltas. Each is stored in the smallest form that gives
back exactly the same float32 values: encoding 1 stores the upper 16 bits of
each value (a delta that arrived as bfloat16 is exactly that: half the
bytes), 2 stores float16 (a delta that arrived as float16), 0 stores float32.
Nothing is pickled; LoggedUpdate.tensors always holds float32 arrays.

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

import fcntl
import json
import logging
import math
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from fedrl.common.durable_files import fsync_directory
from fedrl.server.storage.record_frames import FRAME_HEADER_SIZE, MAX_PAYLOAD, RecordFrames

_log = logging.getLogger(__name__)

_SEGMENT_NAME = re.compile(r"(\d{20})\.wal")
_LOCK_FILE = "LOCK"
_SEGMENT_MAGIC = b"FEDRLWAL"
_FORMAT = 1
_SEGMENT_HEAD = struct.Struct("<8sIQ")
_SEGMENT_HEADER_SIZE = _SEGMENT_HEAD.size + 4
_FRAMES = RecordFrames(b"FRec")
_FIXED = struct.Struct("<qQQQQdIq")
_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MAX_NDIM = 64

# Tensor encodings; see the module docstring.
_FLOAT32, _BFLOAT16_BITS, _FLOAT16 = 0, 1, 2
_ITEMSIZE = {_FLOAT32: 4, _BFLOAT16_BITS: 2, _FLOAT16: 2}
# Values tried before a full pass: one that fails rules an encoding out cheaply.
_PROBE = 64


class UpdateLogError(RuntimeError):
    """The log cannot be used: closed, or a failed fsync left its state unknown."""


class CorruptLogError(UpdateLogError):
    """The log holds damaged data that is not a torn tail; acknowledged updates may be lost."""


@dataclass(frozen=True, eq=False)
class LoggedUpdate:
    """One acknowledged update as the log holds it (eq=False: arrays have no truth value)."""

    lsn: int
    """Log sequence number: assigned by the log, strictly increasing, kept across restarts."""
    session: str
    participant_id: str
    sequence: int
    """The participant's exactly-once key for this push."""
    base_version: int
    samples: int
    env_steps: int
    episodes: int
    weight: float
    """Weight given at acknowledgement (samples cap x staleness discount)."""
    staleness: int
    """Versions between base_version and the newest global when acknowledged."""
    metrics: dict[str, float]
    tensors: list[tuple[str, np.ndarray]]
    """The decoded delta, float32, in model order."""
    received_unix_ms: int

    @property
    def acked_version(self) -> int:
        """The newest global version when the push was acknowledged (PushReply.current_version)."""
        return self.base_version + self.staleness


@dataclass(frozen=True)
class UnreadableRecord:
    """A record whose frame is intact (CRC) but whose payload does not decode."""

    lsn: int
    payload: bytes
    reason: str


def _readable(records: Iterator[LoggedUpdate | UnreadableRecord]) -> Iterator[LoggedUpdate]:
    for record in records:
        if isinstance(record, UnreadableRecord):
            raise CorruptLogError(record.reason)
        yield record


def record_payload(update: LoggedUpdate) -> bytes:
    """The payload the log stores for `update` (the module docstring's layout)."""
    return _encode_payload(
        session=update.session.encode("utf-8", "surrogatepass"),
        participant_id=update.participant_id.encode("utf-8", "surrogatepass"),
        fixed=_FIXED.pack(
            update.base_version,
            update.sequence,
            update.samples,
            update.env_steps,
            update.episodes,
            update.weight,
            update.staleness,
            update.received_unix_ms,
        ),
        metrics=update.metrics,
        tensors=update.tensors,
    )


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
        self._lock_fd = _lock_directory(self._directory)
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
        clean_metrics = _checked_metrics(metrics)
        clean_tensors = _checked_tensors(tensors)
        payload = _encode_payload(
            session=_checked_text(session, "session"),
            participant_id=_checked_text(participant_id, "participant_id"),
            fixed=_fixed_fields(
                base_version=base_version,
                sequence=sequence,
                samples=samples,
                env_steps=env_steps,
                episodes=episodes,
                weight=weight,
                staleness=staleness,
                received_unix_ms=received,
            ),
            metrics=clean_metrics,
            tensors=clean_tensors,
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
        lsn = record.lsn
        return LoggedUpdate(
            lsn=lsn,
            session=session,
            participant_id=participant_id,
            sequence=int(sequence),
            base_version=int(base_version),
            samples=int(samples),
            env_steps=int(env_steps),
            episodes=int(episodes),
            weight=float(weight),
            staleness=int(staleness),
            metrics=clean_metrics,
            tensors=[(name, np.asarray(array, dtype=np.float32)) for name, array in clean_tensors],
            received_unix_ms=int(received),
        )

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
                _write_all(self._fd, frame, position)
                position += len(frame)
        except OSError:
            # Cut the partial frames off, or the next record would follow garbage.
            try:
                os.ftruncate(self._fd, start)
            except OSError as error:
                self._failure = f"could not undo a failed write: {error}"
            raise
        try:
            _datasync(self._fd)
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
            _write_all(fd, _segment_header(first_lsn), 0)
            _datasync(fd)
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
                            yield _decode_payload(payload, lsn, segment.path)
                        except CorruptLogError as error:
                            yield UnreadableRecord(lsn, payload, str(error))
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


# Payload encoding ----------------------------------------------------------


def _fixed_fields(
    *,
    base_version: int,
    sequence: int,
    samples: int,
    env_steps: int,
    episodes: int,
    weight: float,
    staleness: int,
    received_unix_ms: int,
) -> bytes:
    """The fixed-size part of a payload, refusing values its fields cannot hold."""
    i64, u64, u32 = (-(1 << 63), (1 << 63) - 1), (0, (1 << 64) - 1), (0, (1 << 32) - 1)
    checked = {
        "base_version": (base_version, i64),
        "sequence": (sequence, u64),
        "samples": (samples, u64),
        "env_steps": (env_steps, u64),
        "episodes": (episodes, u64),
        "staleness": (staleness, u32),
        "received_unix_ms": (received_unix_ms, i64),
    }
    for name, (value, (low, high)) in checked.items():
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    if not math.isfinite(weight):
        raise ValueError(f"weight must be finite, got {weight}")
    return _FIXED.pack(
        base_version,
        sequence,
        samples,
        env_steps,
        episodes,
        float(weight),
        staleness,
        received_unix_ms,
    )


def _encode_payload(
    *,
    session: bytes,
    participant_id: bytes,
    fixed: bytes,
    metrics: dict[str, float],
    tensors: list[tuple[str, np.ndarray]],
) -> bytes:
    metrics_json = json.dumps(metrics, separators=(",", ":")).encode("utf-8")
    parts: list[bytes | memoryview] = [fixed]
    for text in (session, participant_id, metrics_json):
        parts += [_U32.pack(len(text)), text]
    parts.append(_U32.pack(len(tensors)))
    for name, array in tensors:
        encoding, data = _compact(array)
        name_bytes = name.encode("utf-8")
        parts += [
            _U32.pack(len(name_bytes)),
            name_bytes,
            _U8.pack(encoding),
            _U8.pack(array.ndim),
            struct.pack(f"<{array.ndim}Q", *array.shape),
            _U64.pack(data.nbytes),
            data.data,
        ]
    # join takes the arrays' buffers directly: the only copy of the data.
    return b"".join(parts)


def _compact(array: np.ndarray) -> tuple[int, np.ndarray]:
    """The smallest encoding that gives back exactly these float32 values, as a flat array."""
    values = np.ascontiguousarray(array, dtype="<f4").reshape(-1)
    # Little-endian float32 as 16-bit words: [low half, high half] per value.
    halves = values.view("<u2")
    low, high = halves[0::2], halves[1::2]
    if not low[:_PROBE].any() and not low.any():
        return _BFLOAT16_BITS, np.ascontiguousarray(high)
    if _float16_exact(values[:_PROBE]) and _float16_exact(values):
        return _FLOAT16, values.astype("<f2")
    return _FLOAT32, values


def _float16_exact(values: np.ndarray) -> bool:
    with np.errstate(over="ignore"):
        back = values.astype("<f2").astype("<f4")
    return bool(np.array_equal(back.view("<u4"), values.view("<u4")))


def _decode_payload(payload: bytes, lsn: int, path: Path) -> LoggedUpdate:
    """Rebuild a record; any inconsistency is CorruptLogError, never a partial record."""
    reader = _Reader(payload)
    try:
        fixed = reader.take_struct(_FIXED)
        session = reader.take_text()
        participant_id = reader.take_text()
        metrics = _parse_metrics(reader.take_text())
        tensors = [_decode_tensor(reader) for _ in range(reader.take_struct(_U32)[0])]
        if reader.remaining:
            raise ValueError(f"{reader.remaining} bytes left over after the last tensor")
    except (ValueError, struct.error, OverflowError, RecursionError) as error:
        raise CorruptLogError(f"{path}: record {lsn} does not decode: {error}") from error
    base_version, sequence, samples, env_steps, episodes, weight, staleness, received = fixed
    return LoggedUpdate(
        lsn=lsn,
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


def _decode_tensor(reader: _Reader) -> tuple[str, np.ndarray]:
    name = reader.take_text()
    encoding, ndim = reader.take_struct(_U8)[0], reader.take_struct(_U8)[0]
    if encoding not in _ITEMSIZE:
        raise ValueError(f"tensor {name!r}: unknown encoding {encoding}")
    if ndim > _MAX_NDIM:
        raise ValueError(f"tensor {name!r}: {ndim} dimensions")
    shape = struct.unpack(f"<{ndim}Q", reader.take(8 * ndim))
    size = math.prod(shape)
    (length,) = reader.take_struct(_U64)
    if length != size * _ITEMSIZE[encoding]:
        raise ValueError(f"tensor {name!r}: {length} data bytes for shape {shape}")
    data = reader.take(length)
    if encoding == _BFLOAT16_BITS:
        values = (np.frombuffer(data, dtype="<u2").astype("<u4") << 16).view("<f4")
    elif encoding == _FLOAT16:
        values = np.frombuffer(data, dtype="<f2").astype("<f4")
    else:
        values = np.frombuffer(data, dtype="<f4").copy()
    return name, values.astype(np.float32, copy=False).reshape(shape)


def _parse_metrics(text: str) -> dict[str, float]:
    metrics = json.loads(text)
    if not isinstance(metrics, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values()
    ):
        raise ValueError("metrics are not an object of numbers")
    return {str(k): float(v) for k, v in metrics.items()}


class _Reader:
    """Bounds-checked cursor over a payload; slices are views, not copies."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._position = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._position

    def take(self, count: int) -> memoryview:
        if count > self.remaining:
            raise ValueError(f"needs {count} bytes, {self.remaining} left")
        start = self._position
        self._position += count
        return self._data[start : self._position]

    def take_struct(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack(self.take(layout.size))

    def take_text(self) -> str:
        (length,) = self.take_struct(_U32)
        return str(self.take(int(length)), "utf-8")


# Validation and files --------------------------------------------------------


def _checked_text(value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value)}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {value!r} is not valid Unicode") from None


def _checked_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    result = {}
    for key, value in metrics.items():
        _checked_text(key, "metric name")
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
            raise TypeError(f"metric {key!r} must be a number, got {value!r}")
        result[key] = float(value)
    return result


def _checked_tensors(tensors: Sequence[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    result = list(tensors)
    for index, (name, array) in enumerate(result):
        _checked_text(name, f"tensor {index} name")
        # Any byte order: _compact stores little-endian either way.
        if not isinstance(array, np.ndarray) or array.dtype.newbyteorder("=") != np.float32:
            kind = array.dtype if isinstance(array, np.ndarray) else type(array)
            raise ValueError(f"tensor {name!r}: the log holds float32 deltas, got {kind}")
        if array.ndim > _MAX_NDIM:
            raise ValueError(f"tensor {name!r}: {array.ndim} dimensions, at most {_MAX_NDIM}")
    return result


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


def _write_all(fd: int, data: bytes, offset: int) -> None:
    """pwrite until every byte is written (a regular file may take fewer at once)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _lock_directory(directory: Path) -> int:
    """Hold an exclusive lock on the log, so a second writer fails loudly instead of interleaving.

    flock is released by the kernel when its holder dies, kill -9 included.
    """
    fd = os.open(directory / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UpdateLogError(
            f"update log {directory} is open elsewhere (another server process, or an "
            "UpdateLog not closed); one writer only"
        ) from None
    return fd


def _datasync(fd: int) -> None:
    """fdatasync where the platform has it (it skips the mtime update), else fsync."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    sync(fd)
