"""CRC-checked record frames, the unit of the server's append-only segment files.

The update log and the experience store both append records to segment
files and must tell, after a crash, where the intact records end. Both
frame a record the same way (integers little-endian)::

    magic   4s   the file kind's marker; lets a reader tell a torn tail
                 from damage in the middle, and one kind of file from another
    length  u32  payload bytes
    number  u64  the record's number: the update log's LSN, the store's batch id
    crc     u32  CRC-32 of the payload followed by the length and number fields
    payload length bytes

The number inside the CRC means a record read from the wrong place (an index
pointing at another batch, a renamed segment) fails its check instead of
being taken for the record that was wanted.
"""

from __future__ import annotations

import struct
import zlib
from typing import BinaryIO

_FRAME = struct.Struct("<4sIQI")
_LENGTH_NUMBER = struct.Struct("<IQ")

FRAME_HEADER_SIZE = _FRAME.size
MAX_PAYLOAD = (1 << 32) - 1
"""The length field is a u32."""


class RecordFrames:
    """Frames of one kind of file, told apart by their magic."""

    def __init__(self, magic: bytes) -> None:
        if len(magic) != 4:
            raise ValueError(f"a frame magic is 4 bytes, got {magic!r}")
        self.magic = magic

    def header(self, length: int, number: int, payload_crc: int) -> bytes:
        """The bytes before a payload whose CRC-32 (zlib.crc32) the caller computed already.

        Apart from frame() so the CRC pass over a large payload can run
        before the caller takes a lock and learns the record's number.
        """
        crc = zlib.crc32(_LENGTH_NUMBER.pack(length, number), payload_crc)
        return _FRAME.pack(self.magic, length, number, crc)

    def frame(self, payload: bytes, number: int) -> bytes:
        """One whole record: header and payload."""
        return self.header(len(payload), number, zlib.crc32(payload)) + payload

    def check(
        self, data: bytes | memoryview, position: int, expected_number: int | None = None
    ) -> tuple[int, str | None]:
        """(end of the frame, None) when the frame at `position` is intact, else (_, why)."""
        if len(data) - position < _FRAME.size:
            return position, "record header cut short"
        magic, length, number, crc = _FRAME.unpack_from(data, position)
        if magic != self.magic:
            return position, "no record marker"
        start = position + _FRAME.size
        if length > len(data) - start:
            return position, "record cut short"
        if expected_number is not None and number != expected_number:
            return position, f"record {number} where {expected_number} was due"
        payload = memoryview(data)[start : start + length]
        if zlib.crc32(_LENGTH_NUMBER.pack(length, number), zlib.crc32(payload)) != crc:
            return position, "record fails its CRC"
        return start + length, None

    def payload(self, data: bytes, expected_number: int | None = None) -> bytes | None:
        """The payload of `data` when it is exactly one intact frame, else None."""
        end, problem = self.check(data, 0, expected_number)
        if problem is not None or end != len(data):
            return None
        return data[_FRAME.size :]

    def scan(
        self, data: bytes, position: int, first_number: int | None = None
    ) -> tuple[int, int, str | None]:
        """Walk intact frames from `position`: (where they end, how many, why the walk stopped).

        With `first_number`, numbers must rise by one from it; the reason is
        None when the walk reached the end of `data`.
        """
        count = 0
        while position < len(data):
            expected = None if first_number is None else first_number + count
            end, problem = self.check(data, position, expected)
            if problem is not None:
                return position, count, problem
            position = end
            count += 1
        return position, count, None

    def intact_after(self, data: bytes, position: int) -> bool:
        """True when an intact frame starts after `position`: damage, not a torn tail."""
        found = data.find(self.magic, position + 1)
        while found >= 0:
            if self.check(data, found)[1] is None:
                return True
            found = data.find(self.magic, found + 1)
        return False

    def read(self, file: BinaryIO, expected_number: int) -> bytes | None:
        """The payload of the next frame of `file`; None at the end of the file.

        For files scanned intact before: ValueError says what is wrong if it
        changed since.
        """
        head = file.read(_FRAME.size)
        if not head:
            return None
        length = _FRAME.unpack(head)[1] if len(head) == _FRAME.size else 0
        data = head + file.read(length)
        end, problem = self.check(data, 0, expected_number)
        if problem is not None:
            raise ValueError(problem)
        return data[_FRAME.size : end]
