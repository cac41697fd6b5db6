"""Experience batches through the wire format: round trip, layout, compression, refusals."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from fedrl.common.chunking import DecodeLimits
from fedrl.common.errors import DecodeError
from fedrl.common.experience import (
    BLOCK,
    COLUMNS,
    BatchAssembler,
    ExperienceBatch,
    batch_header,
    batch_messages,
    column_layout,
    decode_batch,
    encode_batch,
)
from fedrl.common.serde import encode_tensor
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from tests.support.experience import assert_same_batch, make_batch

LIMITS = DecodeLimits(max_tensors=1, max_total_raw_bytes=1 << 20)


def _decode(messages: list[pb.ExperienceChunk]) -> ExperienceBatch:
    assembler = BatchAssembler(messages[0].header, LIMITS)
    for message in messages[1:]:
        assembler.add(message.chunk)
    return assembler.result()


def _header(batch: ExperienceBatch) -> pb.ExperienceHeader:
    return batch_header(batch, encode_batch(batch), session="s", participant_id="a", sequence=1)


@pytest.mark.parametrize("codec", [tpb.CODEC_ZSTD, tpb.CODEC_NONE])
def test_batch_round_trips_through_chunked_messages_unchanged(codec: int) -> None:
    batch = make_batch(3000, n_step=3)

    messages = batch_messages(
        batch, session="s", participant_id="Макар", sequence=7, chunk_bytes=4096, codec=codec
    )

    header = messages[0].header
    assert (header.session, header.participant_id, header.sequence) == ("s", "Макар", 7)
    assert header.transitions == 3000 and header.n_step == 3
    assert len(messages) > 2 and all(len(m.chunk.data) <= 4096 for m in messages[1:])
    assert_same_batch(_decode(messages), batch)


def test_the_columns_travel_as_one_block_described_in_the_header() -> None:
    batch = make_batch(100)

    messages = batch_messages(batch, session="s", participant_id="a", sequence=1)

    header = messages[0].header
    assert [spec.name for spec in header.column_specs] == list(COLUMNS)
    assert header.block.tensor_count == 1
    block = messages[1].chunk.header
    assert (block.name, block.dtype, list(block.shape)) == (
        BLOCK,
        tpb.DTYPE_UINT8,
        [header.block.total_raw_size],
    )
    assert sum(1 for m in messages[1:] if m.chunk.HasField("header")) == 1


def test_actions_travel_as_uint8_and_come_back_as_int64() -> None:
    batch = make_batch(100)

    messages = batch_messages(batch, session="s", participant_id="a", sequence=1)

    header = messages[0].header
    dtypes = {spec.name: spec.dtype for spec in header.column_specs}
    assert dtypes["action"] == tpb.DTYPE_UINT8
    assert dtypes["obs"] == tpb.DTYPE_FLOAT32 and dtypes["terminated"] == tpb.DTYPE_BOOL
    assert header.block.total_raw_size == sum(c.nbytes for _, c in batch.columns()) - 7 * 100
    assert _decode(messages).action.dtype == np.int64


def test_actions_beyond_uint8_keep_their_values() -> None:
    batch = dataclasses.replace(make_batch(4), action=np.array([0, 300, 70_000, 2**40]))

    decoded = _decode(batch_messages(batch, session="s", participant_id="a", sequence=1))

    np.testing.assert_array_equal(decoded.action, [0, 300, 70_000, 2**40])
    assert decoded.action.dtype == np.int64


def test_uint8_observations_round_trip_into_aligned_writable_columns() -> None:
    # 11 rows of 3-byte observations put the float32 columns at offset 66, unaligned.
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(12, 3), dtype=np.uint8)
    base = make_batch(11)
    batch = dataclasses.replace(base, obs=frames[:-1], next_obs=frames[1:])
    encoded = encode_batch(batch)
    header = batch_header(batch, encoded, session="s", participant_id="a", sequence=1)

    decoded = decode_batch(header, encoded.block, encoded.data)

    assert_same_batch(decoded, batch)
    for name, column in decoded.columns():
        assert column.flags.aligned and column.flags.writeable, name


def test_one_frame_finds_next_obs_in_obs() -> None:
    # Trajectories, as make_batch builds them: next_obs[i] == obs[i + 1].
    batch = make_batch(10_000)
    per_column = sum(
        encode_tensor(name, column)[0].encoded_size for name, column in batch.columns()
    )

    encoded = encode_batch(batch)

    assert encoded.block.encoded_size < 0.7 * per_column


def test_an_empty_batch_round_trips() -> None:
    batch = make_batch(0)

    assert len(_decode(batch_messages(batch, session="s", participant_id="a", sequence=1))) == 0


def test_a_column_of_a_dtype_that_cannot_travel_is_refused_on_encoding() -> None:
    batch = make_batch(5)
    wide = dataclasses.replace(batch, reward=batch.reward.astype(np.float64))

    with pytest.raises(ValueError, match="'reward' is float64"):
        encode_batch(wide)


def _set_dtype(index: int, dtype: int) -> Callable[[pb.ExperienceHeader], None]:
    def change(header: pb.ExperienceHeader) -> None:
        header.column_specs[index].dtype = dtype  # type: ignore[assignment]

    return change


def _set_shape(index: int, shape: list[int]) -> Callable[[pb.ExperienceHeader], None]:
    def change(header: pb.ExperienceHeader) -> None:
        del header.column_specs[index].shape[:]
        header.column_specs[index].shape.extend(shape)

    return change


def _drop(index: int) -> Callable[[pb.ExperienceHeader], None]:
    def change(header: pb.ExperienceHeader) -> None:
        del header.column_specs[index]

    return change


def _swap(header: pb.ExperienceHeader) -> None:
    first, second = (tpb.TensorSpec(), tpb.TensorSpec())
    first.CopyFrom(header.column_specs[0])
    second.CopyFrom(header.column_specs[1])
    header.column_specs[0].CopyFrom(second)
    header.column_specs[1].CopyFrom(first)
    header.column_specs[0].name, header.column_specs[1].name = "next_obs", "obs"


def _rename(index: int, name: str) -> Callable[[pb.ExperienceHeader], None]:
    def change(header: pb.ExperienceHeader) -> None:
        header.column_specs[index].name = name

    return change


def _no_specs(header: pb.ExperienceHeader) -> None:
    del header.column_specs[:]


def _total(header: pb.ExperienceHeader) -> None:
    header.block.total_raw_size += 4


def _two_tensors(header: pb.ExperienceHeader) -> None:
    header.block.tensor_count = 2


def _rows(header: pb.ExperienceHeader) -> None:
    header.transitions = 11


def _n_step(header: pb.ExperienceHeader) -> None:
    header.n_step = 0


def _gamma(header: pb.ExperienceHeader) -> None:
    header.gamma = float("nan")


REFUSED_HEADERS: list[tuple[str, Callable[[pb.ExperienceHeader], None], str]] = [
    ("no specs (former format)", _no_specs, "column_specs is empty"),
    ("missing column", _drop(6), "in this order"),
    ("duplicate column", _rename(6, "terminated"), "in this order"),
    ("unknown column", _rename(6, "extra"), "in this order"),
    ("columns out of order", _swap, "in this order"),
    ("float action", _set_dtype(4, tpb.DTYPE_FLOAT32), "'action' is float32"),
    ("integer reward", _set_dtype(2, tpb.DTYPE_INT32), "'reward' is int32"),
    ("uint8 terminated", _set_dtype(5, tpb.DTYPE_UINT8), "'terminated' is uint8"),
    ("half precision obs", _set_dtype(0, tpb.DTYPE_BFLOAT16), "'obs' is bfloat16"),
    ("unknown dtype", _set_dtype(1, 99), "'next_obs' is 99"),
    ("row count", _rows, "announces 11 transitions"),
    ("2-d reward", _set_shape(2, [10, 1]), "shape \\[transitions\\]"),
    ("scalar obs", _set_shape(0, []), "impossible shape"),
    ("negative dimension", _set_shape(0, [10, -4]), "impossible shape"),
    ("obs and next_obs differ", _set_shape(1, [10, 2]), "must agree"),
    ("sizes that do not add up", _total, "block header says"),
    ("more than one tensor", _two_tensors, "one block tensor"),
    ("n_step", _n_step, "n_step"),
    ("gamma", _gamma, "gamma"),
]


@pytest.mark.parametrize(
    ("change", "reason"),
    [(c, r) for _, c, r in REFUSED_HEADERS],
    ids=[name for name, _, _ in REFUSED_HEADERS],
)
def test_a_header_that_misdescribes_its_columns_is_refused_before_any_chunk(
    change: Callable[[pb.ExperienceHeader], None], reason: str
) -> None:
    header = _header(make_batch(10))
    change(header)

    with pytest.raises(DecodeError, match=reason):
        BatchAssembler(header, LIMITS)


@pytest.mark.parametrize(
    "shape", [[10, 1 << 40], [10, 0, 2_305_846, 999_998_702_955]], ids=["large", "empty"]
)
def test_columns_larger_than_the_limit_are_refused_before_any_chunk(shape: list[int]) -> None:
    # an empty column is sized by its other dimensions too: numpy could not lay it out
    header = _header(make_batch(10))
    _set_shape(0, shape)(header)

    with pytest.raises(DecodeError, match=r"more than the limit|too large for any array"):
        column_layout(header, max_raw_bytes=LIMITS.max_total_raw_bytes)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [("name", "obs", "one tensor 'columns'"), ("dtype", tpb.DTYPE_BOOL, "of uint8")],
)
def test_a_block_tensor_other_than_announced_is_refused(
    field: str, value: object, reason: str
) -> None:
    messages = batch_messages(make_batch(10), session="s", participant_id="a", sequence=1)
    setattr(messages[1].chunk.header, field, value)
    assembler = BatchAssembler(messages[0].header, LIMITS)

    with pytest.raises(DecodeError, match=reason):
        assembler.add(messages[1].chunk)


def _block_with(
    batch: ExperienceBatch, name: str, raw: bytes
) -> tuple[pb.ExperienceHeader, tpb.TensorHeader, bytes]:
    """batch's header and an uncompressed block whose column `name` starts with raw."""
    encoded = encode_batch(batch, codec=tpb.CODEC_NONE)
    header = batch_header(batch, encoded, session="s", participant_id="a", sequence=1)
    slots = column_layout(header, max_raw_bytes=LIMITS.max_total_raw_bytes)
    offset = next(slot.offset for slot in slots if slot.name == name)
    data = encoded.data[:offset] + raw + encoded.data[offset + len(raw) :]
    return header, encoded.block, data


def test_non_finite_floats_in_the_block_are_refused() -> None:
    batch = make_batch(10)
    header, block, data = _block_with(batch, "discount", np.float32(np.nan).tobytes())

    with pytest.raises(DecodeError, match="'discount' holds NaN"):
        decode_batch(header, block, data)


def test_bool_bytes_other_than_zero_or_one_are_refused() -> None:
    batch = make_batch(10)
    header, block, data = _block_with(batch, "truncated", b"\x02")

    with pytest.raises(DecodeError, match="'truncated': bool bytes"):
        decode_batch(header, block, data)


def test_select_and_concat_keep_rows_and_metadata() -> None:
    batch = make_batch(20, n_step=2)

    joined = ExperienceBatch.concat([batch.select(slice(0, 5)), batch.select(slice(5, 20))])

    assert_same_batch(joined, batch)


def test_concat_refuses_batches_made_differently() -> None:
    with pytest.raises(ValueError, match="different n_step"):
        ExperienceBatch.concat([make_batch(3, n_step=1), make_batch(3, n_step=2)])
