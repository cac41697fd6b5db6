"""UpdateLog: durable round trips, LSNs across restarts, torn tails, corruption, discard."""

from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrl.common.bfloat16 import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from fedrl.server.storage.update_log import CorruptLogError, UpdateLog, UpdateLogError
from fedrl.server.storage.update_record import LoggedUpdate

SEGMENT_HEADER = 24
FRAME_HEADER = 20
RECORD_FIELDS = [
    "lsn",
    "session",
    "participant_id",
    "sequence",
    "base_version",
    "samples",
    "env_steps",
    "episodes",
    "weight",
    "staleness",
    "metrics",
    "received_unix_ms",
]


def delta(seed: int, size: int = 6) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        ("q.0.weight", rng.standard_normal((2, size // 2)).astype(np.float32)),
        ("q.0.bias", rng.standard_normal(1).astype(np.float32)),
    ]


def append(log: UpdateLog, seq: int, **overrides: Any) -> LoggedUpdate:
    fields: dict[str, Any] = {
        "session": "cartpole",
        "participant_id": "Макар",
        "sequence": seq,
        "base_version": 3,
        "samples": 1000 + seq,
        "env_steps": 500,
        "episodes": 7,
        "weight": 0.5,
        "staleness": 2,
        "metrics": {"mean_return": 21.5, "loss": 0.125},
        "tensors": delta(seq),
        "received_unix_ms": 1_700_000_000_000 + seq,
    }
    fields.update(overrides)
    return log.append(**fields)


def assert_same_record(got: LoggedUpdate, expected: LoggedUpdate) -> None:
    for field in RECORD_FIELDS:
        assert getattr(got, field) == getattr(expected, field), field
    assert [n for n, _ in got.tensors] == [n for n, _ in expected.tensors]
    for (_, a), (_, b) in zip(got.tensors, expected.tensors, strict=True):
        assert a.dtype == np.float32
        assert a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.wal"))


def filled_log(directory: Path, count: int) -> list[LoggedUpdate]:
    with UpdateLog(directory) as log:
        return [append(log, sequence) for sequence in range(1, count + 1)]


@dataclass(frozen=True)
class Recorded:
    """A one-segment log of three records, written once, copied into each example."""

    name: str
    data: bytes
    records: list[LoggedUpdate]
    ends: list[int]
    """Segment size after each record."""

    def install(self, directory: Path, data: bytes | None = None) -> Path:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        path = directory / self.name
        path.write_bytes(self.data if data is None else data)
        return path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    directory = tmp_path_factory.mktemp("recorded")
    records, ends = [], []
    with UpdateLog(directory) as log:
        for sequence in range(1, 4):
            records.append(append(log, sequence))
            ends.append(segments(directory)[0].stat().st_size)
    (segment,) = segments(directory)
    return Recorded(segment.name, segment.read_bytes(), records, ends)


# Round trips and LSNs --------------------------------------------------------


def test_replay_gives_back_every_field_exactly(tmp_path: Path) -> None:
    with UpdateLog(tmp_path) as log:
        written = [append(log, 1), append(log, 2, metrics={}, tensors=[])]

        replayed = list(log.replay(0))

    assert [r.lsn for r in written] == [1, 2]
    assert len(replayed) == 2
    for got, expected in zip(replayed, written, strict=True):
        assert_same_record(got, expected)


def test_append_returns_the_update_it_made_durable(tmp_path: Path) -> None:
    with UpdateLog(tmp_path) as log:
        record = append(log, 5)

    assert record.lsn == 1
    assert record.participant_id == "Макар"
    assert record.acked_version == 5
    for (name, got), (_, sent) in zip(record.tensors, delta(5), strict=True):
        assert np.array_equal(got, sent), name


def test_replay_yields_only_records_after_the_given_lsn(tmp_path: Path) -> None:
    filled_log(tmp_path, 5)

    with UpdateLog(tmp_path) as log:
        assert [r.lsn for r in log.replay(3)] == [4, 5]
        assert list(log.replay(5)) == []


def test_lsns_continue_after_a_restart(tmp_path: Path) -> None:
    before = filled_log(tmp_path, 3)

    with UpdateLog(tmp_path) as log:
        assert log.last_lsn == 3
        after = append(log, 4)
        replayed = list(log.replay(0))

    assert after.lsn == 4
    for got, expected in zip(replayed, [*before, after], strict=True):
        assert_same_record(got, expected)


def test_an_empty_log_starts_at_lsn_one(tmp_path: Path) -> None:
    with UpdateLog(tmp_path / "new") as log:
        assert log.last_lsn == 0
        assert append(log, 1).lsn == 1


@pytest.mark.parametrize(
    ("values", "bytes_per_value"),
    [
        (bfloat16_bits_to_float32(float32_to_bfloat16_bits(np.linspace(-3, 3, 4096))), 2),
        (np.linspace(-3, 3, 4096).astype(np.float16).astype(np.float32), 2),
        (np.linspace(-3, 3, 4096).astype(np.float32), 4),
    ],
    ids=["bfloat16", "float16", "float32"],
)
def test_deltas_are_stored_in_the_smallest_exact_form(
    tmp_path: Path, values: np.ndarray, bytes_per_value: int
) -> None:
    tensors = [("w", values.reshape(64, 64))]

    with UpdateLog(tmp_path) as log:
        append(log, 1, tensors=tensors)
        (replayed,) = log.replay(0)

    size = segments(tmp_path)[0].stat().st_size
    assert values.size * bytes_per_value <= size < values.size * bytes_per_value + 512
    assert replayed.tensors[0][1].tobytes() == tensors[0][1].tobytes()


def test_special_values_survive_exactly(tmp_path: Path) -> None:
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38], np.float32)

    with UpdateLog(tmp_path) as log:
        append(log, 1, tensors=[("x", special)])
        (replayed,) = log.replay(0)

    assert replayed.tensors[0][1].tobytes() == special.tobytes()


def test_big_endian_float32_comes_back_native_and_equal(tmp_path: Path) -> None:
    values = np.linspace(-1, 1, 7).astype(">f4")

    with UpdateLog(tmp_path) as log:
        append(log, 1, tensors=[("w", values)])
        (replayed,) = log.replay(0)

    assert replayed.tensors[0][1].dtype == np.float32
    assert np.array_equal(replayed.tensors[0][1], values)


def test_concurrent_appends_get_distinct_contiguous_lsns(tmp_path: Path) -> None:
    results: list[LoggedUpdate] = []
    lock = threading.Lock()

    with UpdateLog(tmp_path, segment_bytes=2048) as log:

        def worker(offset: int) -> None:
            for i in range(10):
                record = append(log, offset + i)
                with lock:
                    results.append(record)

        threads = [threading.Thread(target=worker, args=(100 * t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        replayed = list(log.replay(0))

    assert sorted(r.lsn for r in results) == list(range(1, 41))
    by_lsn = {r.lsn: r for r in results}
    for record in replayed:
        assert_same_record(record, by_lsn[record.lsn])


# Crashes -----------------------------------------------------------------------


def test_a_torn_last_record_is_truncated_at_every_byte_offset(
    tmp_path: Path, recorded: Recorded
) -> None:
    start = recorded.ends[1]

    for cut in range(start, len(recorded.data)):
        path = recorded.install(tmp_path, recorded.data[:cut])

        with UpdateLog(tmp_path) as log:
            assert log.last_lsn == 2, cut
            replayed = list(log.replay(0))
            assert path.stat().st_size == start
            assert append(log, 3).lsn == 3

        assert [r.lsn for r in replayed] == [1, 2]
        assert_same_record(replayed[1], recorded.records[1])


def test_a_bad_crc_in_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    filled_log(tmp_path, 2)
    (segment,) = segments(tmp_path)
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0x01
    segment.write_bytes(bytes(data))

    with UpdateLog(tmp_path) as log:
        assert [r.lsn for r in log.replay(0)] == [1]


def test_a_bad_crc_before_intact_records_refuses_to_open(tmp_path: Path) -> None:
    filled_log(tmp_path, 3)
    (segment,) = segments(tmp_path)
    data = bytearray(segment.read_bytes())
    data[SEGMENT_HEADER + FRAME_HEADER + 3] ^= 0x40
    segment.write_bytes(bytes(data))

    with pytest.raises(CorruptLogError, match=r"damaged at byte 24 \(record fails its CRC\)"):
        UpdateLog(tmp_path)


def test_damage_in_an_older_segment_refuses_to_open(tmp_path: Path) -> None:
    with UpdateLog(tmp_path, segment_bytes=256) as log:
        for sequence in range(1, 4):
            append(log, sequence)
    oldest = segments(tmp_path)[0]
    oldest.write_bytes(oldest.read_bytes()[:-1])

    with pytest.raises(CorruptLogError, match="not a torn write"):
        UpdateLog(tmp_path)


def test_a_missing_segment_refuses_to_open(tmp_path: Path) -> None:
    with UpdateLog(tmp_path, segment_bytes=256) as log:
        for sequence in range(1, 4):
            append(log, sequence)
    segments(tmp_path)[1].unlink()

    with pytest.raises(CorruptLogError, match="records are missing"):
        UpdateLog(tmp_path)


def test_a_segment_torn_while_being_created_is_repaired(tmp_path: Path) -> None:
    filled_log(tmp_path, 2)
    (tmp_path / f"{3:020d}.wal").write_bytes(b"FEDRL")

    with UpdateLog(tmp_path) as log:
        assert log.last_lsn == 2
        assert append(log, 3).lsn == 3

    with UpdateLog(tmp_path) as log:
        assert [r.lsn for r in log.replay(0)] == [1, 2, 3]


def test_a_segment_of_another_format_is_never_repaired(tmp_path: Path) -> None:
    filled_log(tmp_path, 1)
    (segment,) = segments(tmp_path)
    data = bytearray(segment.read_bytes())
    head = struct.pack("<8sIQ", b"FEDRLWAL", 2, 1)
    data[:SEGMENT_HEADER] = head + struct.pack("<I", zlib.crc32(head))
    segment.write_bytes(bytes(data))

    with pytest.raises(CorruptLogError, match="another fedrl version"):
        UpdateLog(tmp_path)

    assert segment.read_bytes() == bytes(data)


def test_a_record_damaged_after_open_is_never_yielded(tmp_path: Path) -> None:
    filled_log(tmp_path, 2)
    (segment,) = segments(tmp_path)

    with UpdateLog(tmp_path) as log:
        data = bytearray(segment.read_bytes())
        data[-5] ^= 0xFF
        segment.write_bytes(bytes(data))
        replay = log.replay(0)

        assert next(replay).lsn == 1
        with pytest.raises(CorruptLogError, match="record 2: record fails its CRC"):
            next(replay)


# Discarding ----------------------------------------------------------------------


def test_discard_through_deletes_whole_folded_segments(tmp_path: Path) -> None:
    # 256 bytes hold one record each: five records, five segments.
    with UpdateLog(tmp_path, segment_bytes=256) as log:
        for sequence in range(1, 6):
            append(log, sequence)
        assert len(segments(tmp_path)) == 5

        deleted = log.discard_through(3)

        assert deleted == 3
        assert [r.lsn for r in log.replay(0)] == [4, 5]


def test_discard_through_keeps_the_newest_segment_and_the_lsn_counter(tmp_path: Path) -> None:
    with UpdateLog(tmp_path, segment_bytes=256) as log:
        for sequence in range(1, 4):
            append(log, sequence)
        log.discard_through(3)
        assert len(segments(tmp_path)) == 1

    with UpdateLog(tmp_path, segment_bytes=256) as log:
        assert log.last_lsn == 3
        assert append(log, 4).lsn == 4


def test_discard_through_keeps_a_segment_until_all_its_records_are_folded(
    tmp_path: Path,
) -> None:
    with UpdateLog(tmp_path / "probe") as probe:
        append(probe, 1)
    record_bytes = segments(tmp_path / "probe")[0].stat().st_size - SEGMENT_HEADER
    # Two records per segment: LSNs {1, 2} and {3, 4}.
    with UpdateLog(tmp_path / "log", segment_bytes=SEGMENT_HEADER + 2 * record_bytes) as log:
        for sequence in range(1, 5):
            append(log, sequence)
        assert len(segments(tmp_path / "log")) == 2

        kept = log.discard_through(1)
        lsns_after_one = [r.lsn for r in log.replay(0)]
        deleted = log.discard_through(2)
        lsns_after_two = [r.lsn for r in log.replay(0)]

    assert kept == 0
    assert lsns_after_one == [1, 2, 3, 4]
    assert deleted == 1
    assert lsns_after_two == [3, 4]


# Refusals ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"tensors": [("w", np.zeros(3, np.float64))]}, ValueError, "float32 deltas"),
        ({"tensors": [("w", [1.0])]}, ValueError, "float32 deltas"),
        ({"sequence": -1}, ValueError, "sequence must be in"),
        ({"staleness": 1 << 32}, ValueError, "staleness must be in"),
        ({"samples": 1.5}, TypeError, "samples must be an integer"),
        ({"weight": math.nan}, ValueError, "weight must be finite"),
        ({"participant_id": "\ud800"}, ValueError, "not valid Unicode"),
        ({"metrics": {"loss": "low"}}, TypeError, "must be a number"),
    ],
)
def test_append_refuses_what_it_cannot_store_exactly(
    tmp_path: Path, overrides: dict[str, Any], error: type[Exception], message: str
) -> None:
    with UpdateLog(tmp_path) as log:
        with pytest.raises(error, match=message):
            append(log, 1, **overrides)

        assert log.last_lsn == 0


def test_a_closed_log_refuses_appends(tmp_path: Path) -> None:
    log = UpdateLog(tmp_path)
    log.close()

    with pytest.raises(UpdateLogError, match="closed"):
        append(log, 1)


def test_a_second_writer_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    with UpdateLog(tmp_path) as log:
        append(log, 1)

        with pytest.raises(UpdateLogError, match="open elsewhere"):
            UpdateLog(tmp_path)

    with UpdateLog(tmp_path) as reopened:
        assert reopened.last_lsn == 1


def test_a_failed_fsync_stops_further_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with UpdateLog(tmp_path) as log:

        def failing(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", failing)
        with pytest.raises(OSError, match="Input/output"):
            append(log, 1)
        monkeypatch.undo()

        with pytest.raises(UpdateLogError, match="restart the server"):
            append(log, 2)


# Decoder properties ----------------------------------------------------------------


def frame(payload: bytes, lsn: int) -> bytes:
    """A record frame as the module docstring specifies it."""
    crc = zlib.crc32(struct.pack("<IQ", len(payload), lsn), zlib.crc32(payload))
    return struct.pack("<4sIQI", b"FRec", len(payload), lsn, crc) + payload


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(garbage=st.binary(min_size=1, max_size=300))
def test_garbage_after_the_last_record_is_dropped(
    tmp_path: Path, recorded: Recorded, garbage: bytes
) -> None:
    recorded.install(tmp_path, recorded.data + garbage)

    with UpdateLog(tmp_path) as log:
        replayed = list(log.replay(0))

    assert len(replayed) == 3
    for got, expected in zip(replayed, recorded.records, strict=True):
        assert_same_record(got, expected)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=400))
def test_a_segment_of_random_bytes_never_yields_a_record(tmp_path: Path, data: bytes) -> None:
    shutil.rmtree(tmp_path, ignore_errors=True)
    tmp_path.mkdir()
    (tmp_path / f"{1:020d}.wal").write_bytes(data)

    try:
        log = UpdateLog(tmp_path)
    except CorruptLogError:
        return
    with log:
        assert list(log.replay(0)) == []
        assert log.last_lsn == 0


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=st.binary(max_size=300))
def test_a_payload_that_does_not_decode_raises_corrupt_log_error(
    tmp_path: Path, recorded: Recorded, payload: bytes
) -> None:
    recorded.install(tmp_path, recorded.data + frame(payload, 4))

    with UpdateLog(tmp_path) as log:
        replay = log.replay(3)
        try:
            record = next(replay)
        except CorruptLogError:
            return
    # A random payload that happens to decode is still a well-formed record.
    assert record.lsn == 4
    assert all(t.dtype == np.float32 for _, t in record.tensors)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_a_flipped_bit_is_caught_or_truncated_never_yielded(
    tmp_path: Path, recorded: Recorded, position: int, bit: int
) -> None:
    data = bytearray(recorded.data)
    data[position % len(data)] ^= 1 << bit
    recorded.install(tmp_path, bytes(data))

    try:
        with UpdateLog(tmp_path) as log:
            replayed = list(log.replay(0))
    except CorruptLogError:
        assert position % len(data) < recorded.ends[1]
        return
    # Only a flip in the last record can look like a torn tail.
    assert position % len(data) >= recorded.ends[1]
    assert [r.lsn for r in replayed] == [1, 2]
    for got, expected in zip(replayed, recorded.records, strict=False):
        assert_same_record(got, expected)


# Real crashes ----------------------------------------------------------------------

APPENDER = """
import sys
from pathlib import Path
import numpy as np
from fedrl.server.storage.update_log import UpdateLog

log = UpdateLog(Path(sys.argv[1]), segment_bytes=1 << 20)
sequence = log.last_lsn
while True:
    sequence += 1
    values = np.random.default_rng(sequence).standard_normal(60_000).astype(np.float32)
    record = log.append(
        session="s", participant_id="Макар", sequence=sequence, base_version=0, samples=1,
        env_steps=1, episodes=1, weight=1.0, staleness=0, metrics={}, tensors=[("w", values)],
    )
    print(record.lsn, flush=True)
"""


def test_kill_9_during_appends_loses_no_acknowledged_update(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    acknowledged = 0

    for _ in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        for _ in range(int(rng.integers(1, 12))):
            acknowledged = int(child.stdout.readline())
        time.sleep(float(rng.uniform(0, 0.01)))
        child.kill()
        child.wait()
        child.stdout.close()

        with UpdateLog(tmp_path) as log:
            replayed = list(log.replay(0))

        lsns = [r.lsn for r in replayed]
        assert lsns == list(range(1, len(lsns) + 1))
        assert lsns[-1] >= acknowledged
        for record in replayed:
            expected = np.random.default_rng(record.sequence).standard_normal(60_000)
            assert record.sequence == record.lsn
            assert np.array_equal(record.tensors[0][1], expected.astype(np.float32))
