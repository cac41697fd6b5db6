"""The experience store on real files and real SQLite: exactly-once, bounds, crash repair."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedrl.common.experience import ExperienceBatch, batch_header, decode_batch, encode_batch
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.server.experience.store import (
    BatchTooLargeError,
    ExperienceStore,
    SequenceError,
    StoreConfig,
    StoredBatch,
    last_acknowledged,
    participant_counts,
)
from tests.support.experience import assert_same_batch, make_batch

SESSION = "default"


class Harness:
    """A store over a real directory and database file, reopenable like a restarted server."""

    def __init__(self, root: Path, config: StoreConfig) -> None:
        self.root = root
        self.config = config
        self.db = sqlite3.connect(root / "state.sqlite3", isolation_level=None)
        self.store = self.open()

    def open(self) -> ExperienceStore:
        return ExperienceStore(
            directory=self.root / "experience", db=self.db, session=SESSION, config=self.config
        )

    def reopen(self) -> None:
        self.store.close()
        self.db.close()
        self.db = sqlite3.connect(self.root / "state.sqlite3", isolation_level=None)
        self.store = self.open()

    def push(self, pid: str, sequence: int, batch: ExperienceBatch) -> int:
        return self.store.append(_stored(pid, sequence, batch), now_ms=1).transitions_stored

    def segments(self) -> list[Path]:
        return sorted((self.root / "experience").glob("*.seg"))

    def close(self) -> None:
        self.store.close()
        self.db.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    opened = Harness(tmp_path, StoreConfig())
    yield opened
    opened.close()


def _stored(pid: str, sequence: int, batch: ExperienceBatch) -> StoredBatch:
    encoded = encode_batch(batch)
    header = batch_header(batch, encoded, session=SESSION, participant_id=pid, sequence=sequence)
    return StoredBatch(header=header, block=encoded.block, data=encoded.data)


def _decoded(stored: StoredBatch) -> ExperienceBatch:
    return decode_batch(stored.header, stored.block, stored.data)


def _senders(batches: list[StoredBatch]) -> list[tuple[str, int]]:
    return [(b.header.participant_id, b.header.sequence) for b in batches]


def test_stored_batch_reads_back_identical_for_another_participant(harness: Harness) -> None:
    batch = make_batch(500, n_step=3)
    harness.push("alice", 1, batch)

    pulled = harness.store.read_after(0, exclude="bob", max_transitions=10_000)

    assert _senders(pulled.batches) == [("alice", 1)]
    assert_same_batch(_decoded(pulled.batches[0]), batch)
    assert pulled.batches[0].header.cursor == pulled.next_cursor == 1


def test_a_participant_never_reads_its_own_batches(harness: Harness) -> None:
    harness.push("alice", 1, make_batch(10))
    harness.push("bob", 1, make_batch(10))
    harness.push("alice", 2, make_batch(10))

    pulled = harness.store.read_after(0, exclude="alice", max_transitions=10_000)

    assert _senders(pulled.batches) == [("bob", 1)]
    assert pulled.next_cursor == 3


def test_cursor_resumes_after_what_was_read(harness: Harness) -> None:
    for sequence in range(1, 4):
        harness.push("alice", sequence, make_batch(10, seed=sequence))
    first = harness.store.read_after(0, exclude="bob", max_transitions=20)

    second = harness.store.read_after(first.next_cursor, exclude="bob", max_transitions=20)

    assert _senders(first.batches) == [("alice", 1), ("alice", 2)]
    assert _senders(second.batches) == [("alice", 3)]


def test_a_batch_larger_than_the_budget_is_still_handed_out_alone(harness: Harness) -> None:
    harness.push("alice", 1, make_batch(100))
    harness.push("alice", 2, make_batch(100))

    pulled = harness.store.read_after(0, exclude="bob", max_transitions=30)

    assert _senders(pulled.batches) == [("alice", 1)]
    assert pulled.next_cursor == 1


def test_cursor_past_every_batch_resynchronises_to_the_newest(harness: Harness) -> None:
    harness.push("alice", 1, make_batch(10))

    pulled = harness.store.read_after(999, exclude="bob", max_transitions=100)

    assert pulled.batches == [] and pulled.next_cursor == 1


def test_duplicate_sequence_is_stored_once_and_answered_as_duplicate(harness: Harness) -> None:
    stored = _stored("alice", 5, make_batch(40))

    first = harness.store.append(stored, now_ms=1)
    again = harness.store.append(stored, now_ms=2)

    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.transitions_stored == 40
    assert len(harness.store.read_after(0, exclude="bob", max_transitions=1000).batches) == 1
    counters = harness.store.counters("alice")
    assert (counters["accepted"], counters["duplicate"]) == (1, 1)


def test_sequence_below_the_newest_that_was_never_acknowledged_is_refused(
    harness: Harness,
) -> None:
    harness.push("alice", 5, make_batch(10))

    with pytest.raises(SequenceError, match="below the last acknowledged 5"):
        harness.push("alice", 4, make_batch(10))


def test_eviction_keeps_the_byte_cap_and_drops_the_oldest_first(tmp_path: Path) -> None:
    record = _record_size(tmp_path / "probe", "alice")
    harness = Harness(
        tmp_path,
        StoreConfig(
            max_bytes=5 * record, participant_quota_bytes=5 * record, segment_bytes=2 * record
        ),
    )

    for sequence in range(1, 13):
        harness.push("alice", sequence, make_batch(100))

    assert harness.store.total_bytes <= 5 * record
    kept = harness.store.read_after(0, exclude="bob", max_transitions=10_000).batches
    assert [b.header.sequence for b in kept] == [8, 9, 10, 11, 12]
    # Whole evicted segments are gone from disk: at most one partly evicted one more than the cap.
    assert len(harness.segments()) <= 4
    assert harness.store.counters("alice")["evicted"] == 7
    harness.close()


def test_quota_stops_one_participant_from_crowding_out_the_others(tmp_path: Path) -> None:
    record = _record_size(tmp_path / "probe", "alice")
    harness = Harness(
        tmp_path, StoreConfig(max_bytes=6 * record, participant_quota_bytes=3 * record)
    )
    harness.push("bob", 1, make_batch(100))
    harness.push("bob", 2, make_batch(100))

    for sequence in range(1, 21):
        harness.push("alice", sequence, make_batch(100))

    assert harness.store.participant_bytes("alice") <= 3 * record
    kept = _senders(harness.store.read_after(0, exclude="carol", max_transitions=10_000).batches)
    assert kept == [("bob", 1), ("bob", 2), ("alice", 18), ("alice", 19), ("alice", 20)]
    harness.close()


def test_a_batch_larger_than_the_quota_is_refused(tmp_path: Path) -> None:
    harness = Harness(tmp_path, StoreConfig(max_bytes=4096, participant_quota_bytes=1024))

    with pytest.raises(BatchTooLargeError, match="quota"):
        harness.push("alice", 1, make_batch(1000))
    harness.close()


def test_restart_keeps_the_store_and_the_acks(harness: Harness) -> None:
    batch = make_batch(64)
    harness.push("alice", 1, batch)

    harness.reopen()

    pulled = harness.store.read_after(0, exclude="bob", max_transitions=1000)
    assert_same_batch(_decoded(pulled.batches[0]), batch)
    assert harness.store.find_ack("alice", 1) is not None
    assert harness.store.last_sequence("alice") == 1


def test_torn_segment_tail_is_cut_back_and_the_rest_served(harness: Harness) -> None:
    for sequence in range(1, 4):
        harness.push("alice", sequence, make_batch(50, seed=sequence))
    harness.store.close()
    segment = harness.segments()[-1]
    committed = segment.stat().st_size
    # What kill -9 in the middle of a write leaves: the start of a fourth record.
    whole = segment.read_bytes()
    with segment.open("ab") as handle:
        handle.write(whole[: len(whole) // 3 // 2])

    harness.reopen()

    assert segment.stat().st_size == committed
    pulled = harness.store.read_after(0, exclude="bob", max_transitions=10_000)
    assert [b.header.sequence for b in pulled.batches] == [1, 2, 3]
    harness.push("alice", 4, make_batch(50, seed=4))
    again = harness.store.read_after(0, exclude="bob", max_transitions=10_000)
    assert [b.header.sequence for b in again.batches] == [1, 2, 3, 4]


def test_a_whole_record_whose_index_row_never_committed_is_cut_and_resent(
    harness: Harness,
) -> None:
    harness.push("alice", 1, make_batch(50, seed=1))
    segment = harness.segments()[-1]
    committed = segment.stat().st_size
    # A crash between the fsync of the record and its index transaction.
    harness.store.close()
    with segment.open("ab") as handle:
        handle.write(segment.read_bytes())

    harness.reopen()

    assert segment.stat().st_size == committed
    assert harness.store.find_ack("alice", 2) is None
    harness.push("alice", 2, make_batch(50, seed=2))
    pulled = harness.store.read_after(0, exclude="bob", max_transitions=10_000)
    assert [b.header.sequence for b in pulled.batches] == [1, 2]


def test_a_damaged_committed_record_is_never_served(harness: Harness) -> None:
    for sequence in range(1, 4):
        harness.push("alice", sequence, make_batch(50, seed=sequence))
    segment = harness.segments()[-1]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))

    pulled = harness.store.read_after(0, exclude="bob", max_transitions=10_000)

    assert [b.header.sequence for b in pulled.batches] == [1, 3]


def test_store_config_refuses_a_quota_above_the_cap() -> None:
    with pytest.raises(ValueError, match="must not exceed"):
        StoreConfig(max_bytes=10, participant_quota_bytes=20)


def _record_size(root: Path, pid: str) -> int:
    """Stored bytes of one make_batch(100) from pid: the unit the bound tests count in."""
    root.mkdir()
    probe = Harness(root, StoreConfig())
    probe.push(pid, 1, make_batch(100))
    size = probe.store.total_bytes
    probe.close()
    return size


def test_header_round_trips_through_a_record(harness: Harness) -> None:
    harness.push("Макар", 3, make_batch(7, n_step=2))

    header: pb.ExperienceHeader = (
        harness.store.read_after(0, exclude="bob", max_transitions=100).batches[0].header
    )

    assert (header.session, header.participant_id, header.sequence) == (SESSION, "Макар", 3)
    assert (header.transitions, header.n_step, header.cursor) == (7, 2, 1)


def test_status_helpers_read_counts_and_last_sequence_through_another_connection(
    harness: Harness,
) -> None:
    harness.push("alice", 4, make_batch(10))
    harness.store.count_rejection("alice", now_ms=1)
    reader = sqlite3.connect(harness.root / "state.sqlite3")

    counts = participant_counts(reader, SESSION)
    last = last_acknowledged(reader, SESSION, "alice")
    reader.close()

    assert counts == {"alice": (1, 1)}
    assert last == 4


def test_status_helpers_answer_empty_before_the_store_ever_ran(tmp_path: Path) -> None:
    fresh = sqlite3.connect(tmp_path / "state.sqlite3")

    assert participant_counts(fresh, SESSION) == {}
    assert last_acknowledged(fresh, SESSION, "alice") == 0
    fresh.close()
