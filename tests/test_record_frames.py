"""server.record_frames: intact records found, torn tails and misplaced records told apart."""

from __future__ import annotations

import io

import pytest

from fedrl.server.storage.record_frames import FRAME_HEADER_SIZE, RecordFrames

FRAMES = RecordFrames(b"TEST")


def test_records_scan_back_with_their_numbers_in_order() -> None:
    data = b"".join(FRAMES.frame(bytes([n]) * n, n) for n in range(5, 9))

    end, count, problem = FRAMES.scan(data, 0, first_number=5)

    assert (end, count, problem) == (len(data), 4, None)


def test_a_torn_tail_ends_the_scan_at_the_last_whole_record() -> None:
    whole = FRAMES.frame(b"first", 1)
    torn = FRAMES.frame(b"second", 2)[:-2]

    end, count, problem = FRAMES.scan(whole + torn, 0, first_number=1)

    assert (end, count, problem) == (len(whole), 1, "record cut short")
    assert not FRAMES.intact_after(whole + torn, end)


def test_damage_followed_by_an_intact_record_is_seen_as_damage() -> None:
    first, second = FRAMES.frame(b"first", 1), FRAMES.frame(b"second", 2)
    damaged = bytearray(first + second)
    damaged[FRAME_HEADER_SIZE] ^= 0xFF

    end, count, problem = FRAMES.scan(bytes(damaged), 0)

    assert (end, count, problem) == (0, 0, "record fails its CRC")
    assert FRAMES.intact_after(bytes(damaged), end)


def test_a_record_read_where_another_number_was_expected_is_refused() -> None:
    record = FRAMES.frame(b"batch 7", 7)

    assert FRAMES.payload(record, 7) == b"batch 7"
    assert FRAMES.payload(record, 8) is None
    assert FRAMES.check(record, 0, 8)[1] == "record 7 where 8 was due"


def test_another_kind_of_file_is_not_read_as_records() -> None:
    other = RecordFrames(b"ELSE").frame(b"payload", 1)

    assert FRAMES.scan(other, 0) == (0, 0, "no record marker")


def test_reading_a_file_frame_by_frame_stops_at_its_end_or_at_a_change() -> None:
    data = FRAMES.frame(b"one", 1) + FRAMES.frame(b"two", 2)

    file = io.BytesIO(data)
    assert [FRAMES.read(file, 1), FRAMES.read(file, 2), FRAMES.read(file, 3)] == [
        b"one",
        b"two",
        None,
    ]
    with pytest.raises(ValueError, match="record 1 where 2 was due"):
        FRAMES.read(io.BytesIO(data), 2)


def test_a_magic_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="4 bytes"):
        RecordFrames(b"TOOLONG")
