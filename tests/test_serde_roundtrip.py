"""Tensors survive the wire: every dtype x codec x shape, and bfloat16 rounds as hardware does."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedrl.common.bfloat16 import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from fedrl.common.chunking import assemble, chunk_tensors
from fedrl.common.serde import decode_tensor, encode_tensor
from fedrl.proto.v1 import tensor_pb2 as pb

CODECS = [pb.CODEC_NONE, pb.CODEC_ZSTD]
NATIVE_DTYPES = [np.float32, np.float16, np.int64, np.int32, np.uint8, np.bool_]
# Values near float32's maximum round to infinity in bfloat16; stay clear of it.
_BIG = float(np.float32(1e30))
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=7)


def _arrays(dtype: type) -> st.SearchStrategy[np.ndarray]:
    elements = None
    if dtype in (np.float32, np.float16):
        elements = st.floats(
            width=32 if dtype is np.float32 else 16, allow_nan=False, allow_infinity=False
        )
    return hnp.arrays(dtype, SHAPES, elements=elements)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(NATIVE_DTYPES), codec=st.sampled_from(CODECS))
def test_native_dtypes_round_trip_exactly(data: st.DataObject, dtype: type, codec: int) -> None:
    array = data.draw(_arrays(dtype))

    header, payload = encode_tensor("t", array, codec=codec)
    decoded = decode_tensor(header, payload, max_raw_bytes=1 << 20)

    assert decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array.astype(decoded.dtype))


@settings(max_examples=60, deadline=None)
@given(
    array=hnp.arrays(np.float32, SHAPES, elements=st.floats(-_BIG, _BIG, width=32)),
    codec=st.sampled_from(CODECS),
)
def test_bfloat16_transfer_equals_local_rounding(array: np.ndarray, codec: int) -> None:
    header, payload = encode_tensor("t", array, dtype=pb.DTYPE_BFLOAT16, codec=codec)

    decoded = decode_tensor(header, payload, max_raw_bytes=1 << 20)

    expected = bfloat16_bits_to_float32(float32_to_bfloat16_bits(array))
    assert decoded.dtype == np.float32 and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, expected)
    # bfloat16 keeps 8 significant bits: relative error at most 2**-9.
    np.testing.assert_allclose(decoded, array, rtol=2.0**-8, atol=1e-38)


@pytest.mark.parametrize(
    ("float32_bits", "bfloat16_bits"),
    [
        (0x00000000, 0x0000),  # +0
        (0x80000000, 0x8000),  # -0
        (0x7F800000, 0x7F80),  # +inf
        (0xFF800000, 0xFF80),  # -inf
        (0x7FC00000, 0x7FC0),  # quiet NaN
        (0x7F800001, 0x7FC0),  # NaN with payload only in the dropped bits stays NaN
        (0x3F800000, 0x3F80),  # 1.0
        (0x3F808000, 0x3F80),  # exactly halfway, lower neighbour even: down
        (0x3F818000, 0x3F82),  # exactly halfway, lower neighbour odd: up
        (0x3F808001, 0x3F81),  # just above halfway: up
        (0x3F807FFF, 0x3F80),  # just below halfway: down
        (0x00000001, 0x0000),  # smallest subnormal rounds to zero
        (0x00010000, 0x0001),  # smallest bfloat16 subnormal is exact
        (0x00008000, 0x0000),  # subnormal halfway, even: down
        (0x00018000, 0x0002),  # subnormal halfway, odd: up
        (0x807F8000, 0x8080),  # negative subnormal halfway, odd (0x807F): up in magnitude
        (0x7F7FFFFF, 0x7F80),  # largest float32 rounds to infinity
        (0x7F7F7FFF, 0x7F7F),  # largest finite bfloat16 neighbourhood stays finite
    ],
)
def test_bfloat16_rounding_matches_hand_computed_bits(
    float32_bits: int, bfloat16_bits: int
) -> None:
    value = np.array([float32_bits], dtype=np.uint32).view(np.float32)

    bits = float32_to_bfloat16_bits(value)

    assert int(bits[0]) == bfloat16_bits


def test_bfloat16_widening_is_exact_for_every_pattern() -> None:
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)

    widened = bfloat16_bits_to_float32(patterns)
    back = float32_to_bfloat16_bits(widened)

    finite = np.isfinite(widened)
    np.testing.assert_array_equal(back[finite], patterns[finite])
    assert np.isnan(widened[~finite & ~np.isinf(widened)]).all()


def test_zero_dimensional_and_empty_tensors_keep_their_shapes() -> None:
    tensors = [("scalar", np.array(2.5, np.float32)), ("empty", np.zeros((0, 3), np.int64))]

    header, chunks = chunk_tensors(tensors, chunk_bytes=8)
    decoded = assemble(header, chunks)

    assert [(n, a.shape) for n, a in decoded] == [("scalar", ()), ("empty", (0, 3))]
    assert float(decoded[0][1]) == 2.5


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=0, max_size=6),
    chunk_bytes=st.integers(1, 4096),
    codec=st.sampled_from(CODECS),
    dtype=st.sampled_from([None, pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16]),
)
def test_tensor_lists_survive_chunking(
    sizes: list[int], chunk_bytes: int, codec: int, dtype: int | None
) -> None:
    rng = np.random.default_rng(len(sizes))
    tensors = [
        (f"layer{i}.weight", rng.standard_normal(n).astype(np.float32)) for i, n in enumerate(sizes)
    ]

    header, chunks = chunk_tensors(tensors, dtype=dtype, codec=codec, chunk_bytes=chunk_bytes)
    decoded = assemble(header, chunks)

    assert all(len(c.data) <= chunk_bytes for c in chunks)
    assert [n for n, _ in decoded] == [n for n, _ in tensors]
    tolerance = {None: 0.0, pb.DTYPE_FLOAT16: 1e-3, pb.DTYPE_BFLOAT16: 8e-3}[dtype]
    for (_, got), (_, want) in zip(decoded, tensors, strict=True):
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_large_tensor_streams_in_bounded_chunks() -> None:
    weights = np.random.default_rng(0).standard_normal((2048, 1024)).astype(np.float32)

    header, chunks = chunk_tensors([("w", weights)], codec=pb.CODEC_NONE)
    decoded = assemble(header, chunks)

    assert len(chunks) == 8
    assert max(c.ByteSize() for c in chunks) < (1 << 20) + 1024
    np.testing.assert_array_equal(decoded[0][1], weights)


def test_encoding_from_many_threads_at_once_is_safe() -> None:
    arrays = [
        np.random.default_rng(i).standard_normal(200_000).astype(np.float32) for i in range(8)
    ]
    # What one thread alone gets: the bfloat16 rounding of each array, bit for bit.
    expected = [
        decode_tensor(
            *encode_tensor("w", array, dtype=pb.DTYPE_BFLOAT16), max_raw_bytes=1 << 22
        ).tobytes()
        for array in arrays
    ]

    def encode_and_decode(index: int) -> bool:
        for _ in range(5):
            header, data = encode_tensor("w", arrays[index], dtype=pb.DTYPE_BFLOAT16)
            decoded = decode_tensor(header, data, max_raw_bytes=1 << 22)
            if decoded.shape != arrays[index].shape or decoded.tobytes() != expected[index]:
                return False
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(encode_and_decode, range(len(arrays))))
