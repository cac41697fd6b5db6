"""Hostile tensor input: every malformed case raises DecodeError and allocates within the bound."""

from __future__ import annotations

import contextlib
import tracemalloc

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fedrl.common.chunking import DecodeLimits, TensorListAssembler, assemble, chunk_tensors
from fedrl.common.errors import DecodeError
from fedrl.common.serde import decode_tensor, encode_tensor
from fedrl.proto.v1 import tensor_pb2 as pb

MiB = 1 << 20


def _encoded(codec: int = pb.CODEC_ZSTD) -> tuple[pb.TensorHeader, bytes]:
    return encode_tensor("w", np.linspace(-1, 1, 1000, dtype=np.float32), codec=codec)


@pytest.mark.parametrize("codec", [pb.CODEC_NONE, pb.CODEC_ZSTD])
def test_truncated_payload_is_refused(codec: int) -> None:
    header, data = _encoded(codec)
    header.encoded_size = len(data) - 7

    with pytest.raises(DecodeError):
        decode_tensor(header, data[:-7], max_raw_bytes=MiB)


def test_payload_longer_than_declared_is_refused() -> None:
    header, data = _encoded()

    with pytest.raises(DecodeError, match="payload has"):
        decode_tensor(header, data + b"\0", max_raw_bytes=MiB)


def test_raw_size_disagreeing_with_shape_is_refused() -> None:
    header, data = _encoded()
    header.raw_size += 4

    with pytest.raises(DecodeError, match="shape"):
        decode_tensor(header, data, max_raw_bytes=MiB)


def test_shape_disagreeing_with_bytes_is_refused() -> None:
    header, data = _encoded(pb.CODEC_NONE)
    del header.shape[:]
    header.shape.extend([999])
    header.raw_size = 999 * 4

    with pytest.raises(DecodeError):
        decode_tensor(header, data, max_raw_bytes=MiB)


def test_declared_size_over_the_bound_is_refused_before_decoding() -> None:
    header, data = _encoded()

    with pytest.raises(DecodeError, match="exceeds the limit"):
        decode_tensor(header, data, max_raw_bytes=100)


@pytest.mark.parametrize("dtype", [0, 8, 99, -1])
def test_unknown_dtype_is_refused(dtype: int) -> None:
    header, data = _encoded()
    header.dtype = dtype  # type: ignore[assignment]

    with pytest.raises(DecodeError, match="dtype"):
        decode_tensor(header, data, max_raw_bytes=MiB)


def test_unknown_codec_is_refused() -> None:
    header, data = _encoded()
    header.codec = 7  # type: ignore[assignment]

    with pytest.raises(DecodeError, match="codec"):
        decode_tensor(header, data, max_raw_bytes=MiB)


def test_negative_dimension_is_refused() -> None:
    header, data = _encoded()
    header.shape[0] = -1000

    with pytest.raises(DecodeError, match="negative"):
        decode_tensor(header, data, max_raw_bytes=MiB)


def test_decompression_bomb_is_refused_within_the_bound() -> None:
    # 256 MiB of zeros squeezed into a few kilobytes, declared as 4 KiB.
    bomb = zstandard.ZstdCompressor().compressobj()
    data = bomb.compress(bytes(256 * MiB)) + bomb.flush()
    header = pb.TensorHeader(
        name="w",
        dtype=pb.DTYPE_UINT8,
        shape=[4096],
        codec=pb.CODEC_ZSTD,
        raw_size=4096,
        encoded_size=len(data),
    )

    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match="expands to more"):
            decode_tensor(header, data, max_raw_bytes=MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert len(data) < 64 * 1024
    assert peak < MiB


def test_frame_declaring_another_size_is_refused() -> None:
    data = zstandard.ZstdCompressor().compress(bytes(10 * MiB))
    header = pb.TensorHeader(
        name="w",
        dtype=pb.DTYPE_UINT8,
        shape=[16],
        codec=pb.CODEC_ZSTD,
        raw_size=16,
        encoded_size=len(data),
    )

    with pytest.raises(DecodeError, match="declares"):
        decode_tensor(header, data, max_raw_bytes=MiB)


def test_garbage_instead_of_zstd_is_refused() -> None:
    header, data = _encoded()
    garbage = bytes(len(data))

    with pytest.raises(DecodeError):
        decode_tensor(header, garbage, max_raw_bytes=MiB)


def test_nan_and_infinity_are_refused() -> None:
    for bad in (np.nan, np.inf, -np.inf):
        header, data = encode_tensor("w", np.array([1.0, bad], np.float32))
        with pytest.raises(DecodeError, match="NaN or infinite"):
            decode_tensor(header, data, max_raw_bytes=MiB)


def test_bool_bytes_other_than_zero_or_one_are_refused() -> None:
    header = pb.TensorHeader(
        name="done", dtype=pb.DTYPE_BOOL, shape=[2], codec=pb.CODEC_NONE, raw_size=2, encoded_size=2
    )

    with pytest.raises(DecodeError, match="bool"):
        decode_tensor(header, b"\x01\x07", max_raw_bytes=MiB)


def _stream() -> tuple[pb.TensorListHeader, list[pb.TensorChunk]]:
    tensors = [(f"t{i}", np.full(3000, i, np.float32)) for i in range(3)]
    return chunk_tensors(tensors, codec=pb.CODEC_NONE, chunk_bytes=5000)


def test_chunks_out_of_order_are_refused() -> None:
    header, chunks = _stream()
    chunks[1], chunks[2] = chunks[2], chunks[1]

    with pytest.raises(DecodeError, match="arrived where chunk 1 was due"):
        assemble(header, chunks)


def test_repeated_chunk_is_refused() -> None:
    header, chunks = _stream()

    with pytest.raises(DecodeError, match="due"):
        assemble(header, [chunks[0], chunks[0], *chunks[1:]])


def test_missing_final_chunk_is_refused() -> None:
    header, chunks = _stream()

    with pytest.raises(DecodeError, match="ended early"):
        assemble(header, chunks[:-1])


def test_missing_last_flag_is_refused() -> None:
    header, chunks = _stream()
    chunks[-1].last = False

    with pytest.raises(DecodeError, match="final chunk missing"):
        assemble(header, chunks)


def test_chunk_after_the_last_is_refused() -> None:
    header, chunks = _stream()
    extra = pb.TensorChunk(index=len(chunks), data=b"x")

    with pytest.raises(DecodeError, match="after the last"):
        assemble(header, [*chunks, extra])


def test_list_header_over_the_limits_is_refused_before_any_chunk() -> None:
    header, _ = _stream()

    with pytest.raises(DecodeError, match="exceeds the limit"):
        TensorListAssembler(header, DecodeLimits(max_total_raw_bytes=1000))
    with pytest.raises(DecodeError, match="tensors exceeds"):
        TensorListAssembler(header, DecodeLimits(max_tensors=2))


def test_tensor_larger_than_the_list_total_is_refused() -> None:
    header, chunks = _stream()
    header.total_raw_size = 12_000 * 2

    with pytest.raises(DecodeError):
        assemble(header, chunks)


def test_oversized_chunk_is_refused() -> None:
    header, chunks = chunk_tensors([("w", np.zeros(300_000, np.float32))], codec=pb.CODEC_NONE)

    with pytest.raises(DecodeError, match="chunk of"):
        assemble(header, chunks, DecodeLimits(max_chunk_bytes=1000))


def test_duplicate_tensor_names_are_refused() -> None:
    header, chunks = _stream()
    second = [c for c in chunks if c.HasField("header")][1]
    second.header.name = "t0"

    with pytest.raises(DecodeError, match="twice"):
        assemble(header, chunks)


def test_more_tensors_than_declared_are_refused() -> None:
    header, chunks = _stream()
    header.tensor_count = 2

    with pytest.raises(DecodeError):
        assemble(header, chunks)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_corruption_of_a_stream_never_escapes_decode_error(data: st.DataObject) -> None:
    header, chunks = chunk_tensors(
        [("a", np.arange(500, dtype=np.float32)), ("b", np.ones((7, 9), np.int64))],
        chunk_bytes=256,
    )
    wire = [c.SerializeToString() for c in chunks]
    position = data.draw(st.integers(0, len(wire) - 1))
    blob = bytearray(wire[position])
    for _ in range(data.draw(st.integers(1, 8))):
        if blob:
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    try:
        wire[position] = pb.TensorChunk.FromString(bytes(blob)).SerializeToString()
    except Exception:
        return

    with contextlib.suppress(DecodeError):
        assemble(header, [pb.TensorChunk.FromString(w) for w in wire])


@settings(max_examples=100, deadline=None)
@given(
    raw=st.binary(max_size=2048),
    dtype=st.integers(-2, 9),
    codec=st.integers(-1, 3),
    shape=st.lists(st.integers(-3, 10**12), max_size=10),
    raw_size=st.integers(0, 2**62),
)
# Empty, yet sized by its other dimensions beyond what numpy can lay out.
@example(raw=b"", dtype=1, codec=1, shape=[0, 2_305_846, 999_998_702_955], raw_size=0)
@example(raw=b"", dtype=2, codec=1, shape=[0, 2_305_846, 999_998_702_955], raw_size=0)
def test_arbitrary_headers_and_payloads_raise_only_decode_error(
    raw: bytes, dtype: int, codec: int, shape: list[int], raw_size: int
) -> None:
    header = pb.TensorHeader(name="x", shape=shape, raw_size=raw_size, encoded_size=len(raw))
    header.dtype = dtype  # type: ignore[assignment]
    header.codec = codec  # type: ignore[assignment]

    with contextlib.suppress(DecodeError):
        decode_tensor(header, raw, max_raw_bytes=MiB)
