"""Lists of named tensors <-> bounded chunks of a gRPC stream.

A list travels as a TensorListHeader (inside the RPC's own header message)
followed by TensorChunk messages: each tensor's encoded bytes are cut into
pieces of at most chunk_bytes, the first piece carrying the tensor's header.
Nothing on the wire grows with the model, so a 50M-parameter model crosses
with the same message sizes as a 4-parameter one.

The assembler trusts nothing: it checks the list totals against the caller's
limits before accepting a byte, chunk indices for gaps and reordering, every
tensor header, every running total, and the final flag; it decodes each tensor
as soon as its bytes are complete so at most one encoded tensor is buffered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fedrl.common.codecs import encoded_size_bound
from fedrl.common.errors import DecodeError
from fedrl.common.serde import decode_tensor, encode_tensor, header_raw_size
from fedrl.proto.v1 import tensor_pb2 as pb

NamedTensors = list[tuple[str, np.ndarray]]

# gRPC's default message limit is 4 MiB; 1 MiB pieces leave room for headers
# and keep per-message latency low on slow links.
DEFAULT_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class DecodeLimits:
    """What a receiver is prepared to accept from one stream."""

    max_tensors: int = 10_000
    """Tensors in one list."""
    max_total_raw_bytes: int = 1 << 30
    """Decoded bytes of the whole list (1 GiB: a 250M-parameter float32 model)."""
    max_chunk_bytes: int = 4 * DEFAULT_CHUNK_BYTES
    """Data bytes in one chunk; senders use DEFAULT_CHUNK_BYTES, slack for other clients."""
    require_finite: bool = True
    """Refuse NaN and infinities in floating tensors."""


def chunk_tensors(
    tensors: Sequence[tuple[str, np.ndarray]],
    *,
    dtype: int | None = None,
    codec: int = pb.CODEC_ZSTD,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[pb.TensorListHeader, list[pb.TensorChunk]]:
    """Encode tensors and cut them into chunks; dtype applies to floating tensors only."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    names = [name for name, _ in tensors]
    if len(set(names)) != len(names):
        raise ValueError("tensor names must be unique")
    chunks: list[pb.TensorChunk] = []
    total_raw = total_encoded = 0
    for name, array in tensors:
        values = np.asarray(array)
        target = dtype if dtype is not None and values.dtype.kind == "f" else None
        header, data = encode_tensor(name, values, dtype=target, codec=codec)
        total_raw += header.raw_size
        total_encoded += header.encoded_size
        pieces = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]
        for position, piece in enumerate(pieces):
            chunk = pb.TensorChunk(index=len(chunks), data=piece)
            if position == 0:
                chunk.header.CopyFrom(header)
            chunks.append(chunk)
    if chunks:
        chunks[-1].last = True
    list_header = pb.TensorListHeader(
        tensor_count=len(tensors), total_encoded_size=total_encoded, total_raw_size=total_raw
    )
    return list_header, chunks


class TensorListAssembler:
    """Rebuilds a tensor list from its chunks, refusing anything out of line."""

    def __init__(self, header: pb.TensorListHeader, limits: DecodeLimits = DecodeLimits()) -> None:
        if header.tensor_count > limits.max_tensors:
            raise DecodeError(
                f"{header.tensor_count} tensors exceeds the limit of {limits.max_tensors}"
            )
        if header.total_raw_size > limits.max_total_raw_bytes:
            raise DecodeError(
                f"{header.total_raw_size} bytes exceeds the limit of {limits.max_total_raw_bytes}"
            )
        if header.total_encoded_size > encoded_size_bound(pb.CODEC_ZSTD, header.total_raw_size):
            raise DecodeError(
                f"declared encoded size {header.total_encoded_size} is impossible for "
                f"{header.total_raw_size} raw bytes"
            )
        self._header = header
        self._limits = limits
        self._next_index = 0
        self._raw_seen = 0
        self._encoded_seen = 0
        self._names: set[str] = set()
        self._current: pb.TensorHeader | None = None
        self._buffer = bytearray()
        self._result: NamedTensors = []
        self._finished = header.tensor_count == 0

    @property
    def complete(self) -> bool:
        """True once the final chunk arrived and every tensor decoded."""
        return self._finished

    def add(self, chunk: pb.TensorChunk) -> None:
        """Take the next chunk of the stream."""
        if self._finished:
            raise DecodeError("chunk after the last one of the tensor list")
        if chunk.index != self._next_index:
            raise DecodeError(f"chunk {chunk.index} arrived where chunk {self._next_index} was due")
        self._next_index += 1
        if len(chunk.data) > self._limits.max_chunk_bytes:
            raise DecodeError(
                f"chunk of {len(chunk.data)} bytes exceeds the limit of "
                f"{self._limits.max_chunk_bytes}"
            )
        if chunk.HasField("header"):
            self._start_tensor(chunk.header)
        elif self._current is None:
            raise DecodeError("chunk data outside any tensor (header missing)")
        if chunk.data:
            current = self._current
            if current is None or len(self._buffer) + len(chunk.data) > current.encoded_size:
                name = current.name if current else self._result[-1][0]
                raise DecodeError(f"tensor {name!r}: more than its declared encoded bytes")
            self._buffer += chunk.data
            if len(self._buffer) == current.encoded_size:
                self._finish_tensor()
        if chunk.last:
            self._finish_list()

    def result(self) -> NamedTensors:
        """The decoded tensors, in stream order; DecodeError if the stream was cut short."""
        if not self._finished:
            raise DecodeError(
                f"tensor stream ended early: {len(self._result)} of "
                f"{self._header.tensor_count} tensors complete, final chunk missing"
            )
        return self._result

    def _start_tensor(self, header: pb.TensorHeader) -> None:
        if self._current is not None:
            raise DecodeError(
                f"tensor {self._current.name!r} ended after {len(self._buffer)} of "
                f"{self._current.encoded_size} bytes"
            )
        if len(self._result) >= self._header.tensor_count:
            raise DecodeError(f"more than the declared {self._header.tensor_count} tensors")
        if header.name in self._names:
            raise DecodeError(f"tensor {header.name!r} appears twice")
        remaining = self._header.total_raw_size - self._raw_seen
        raw_size = header_raw_size(header, max_raw_bytes=remaining)
        if header.encoded_size > encoded_size_bound(header.codec, raw_size):
            raise DecodeError(
                f"tensor {header.name!r}: encoded size {header.encoded_size} is impossible "
                f"for {raw_size} raw bytes"
            )
        if self._encoded_seen + header.encoded_size > self._header.total_encoded_size:
            raise DecodeError(f"tensor {header.name!r}: exceeds the list's declared encoded size")
        self._names.add(header.name)
        self._raw_seen += raw_size
        self._encoded_seen += header.encoded_size
        self._current = header
        self._buffer = bytearray()
        if header.encoded_size == 0:
            self._finish_tensor()

    def _finish_tensor(self) -> None:
        assert self._current is not None
        header, data = self._current, self._buffer
        self._current, self._buffer = None, bytearray()
        array = decode_tensor(
            header,
            data,
            max_raw_bytes=header.raw_size,
            require_finite=self._limits.require_finite,
        )
        self._result.append((header.name, array))

    def _finish_list(self) -> None:
        if self._current is not None:
            raise DecodeError(
                f"final chunk arrived inside tensor {self._current.name!r} "
                f"({len(self._buffer)} of {self._current.encoded_size} bytes)"
            )
        if len(self._result) != self._header.tensor_count:
            raise DecodeError(
                f"final chunk after {len(self._result)} of {self._header.tensor_count} tensors"
            )
        if (
            self._raw_seen != self._header.total_raw_size
            or self._encoded_seen != self._header.total_encoded_size
        ):
            raise DecodeError("tensor sizes do not add up to the list header's totals")
        self._finished = True


def assemble(
    header: pb.TensorListHeader,
    chunks: Iterable[pb.TensorChunk],
    limits: DecodeLimits = DecodeLimits(),
) -> NamedTensors:
    """Decode a whole list from an iterable of chunks."""
    assembler = TensorListAssembler(header, limits)
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.result()
