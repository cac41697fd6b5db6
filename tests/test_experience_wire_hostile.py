"""Property tests of the experience decoder: any batch round trips; hostile input only ever
raises DecodeError, and within a memory bound."""

from __future__ import annotations

import contextlib
import tracemalloc
from collections.abc import Iterator

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrl.common.chunking import DecodeLimits
from fedrl.common.errors import DecodeError
from fedrl.common.experience import BatchAssembler, ExperienceBatch, batch_messages
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from tests.support.experience import assert_same_batch, make_batch

KiB, MiB = 1 << 10, 1 << 20
LIMITS = DecodeLimits(max_tensors=1, max_total_raw_bytes=256 * KiB, max_chunk_bytes=64 * KiB)

OBS_DTYPES = (np.float32, np.uint8, np.int32, np.int64, np.bool_)
# Largest action of a batch: each picks another wire width (uint8, int32, int64).
ACTION_HIGHS = (1, 255, 70_000, 2**40)


def _assemble(messages: list[pb.ExperienceChunk], limits: DecodeLimits = LIMITS) -> ExperienceBatch:
    assembler = BatchAssembler(messages[0].header, limits)
    for message in messages[1:]:
        assembler.add(message.chunk)
    return assembler.result()


@contextlib.contextmanager
def _peak_memory() -> Iterator[list[int]]:
    """Peak bytes Python allocated inside the block, appended to the yielded list."""
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield peak
        peak.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()


@st.composite
def batches(draw: st.DrawFn) -> ExperienceBatch:
    rows = draw(st.integers(0, 300))
    obs_shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=2)))
    obs_dtype = draw(st.sampled_from(OBS_DTYPES))
    n_step = draw(st.integers(1, 5))
    gamma = draw(st.floats(0.5, 1.0))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    states: np.ndarray = rng.normal(0, 100, size=(rows + 1, *obs_shape)).astype(obs_dtype)
    terminated = rng.random(rows) < 0.1
    return ExperienceBatch(
        obs=states[:-1],
        action=rng.integers(0, draw(st.sampled_from(ACTION_HIGHS)) + 1, size=rows),
        reward=rng.normal(0, 1, size=rows).astype(np.float32),
        next_obs=states[1:],
        discount=np.where(terminated, 0.0, gamma).astype(np.float32),
        terminated=terminated,
        truncated=~terminated & (rng.random(rows) < 0.1),
        n_step=n_step,
        gamma=gamma,
        env_spec_hash="ab" * 32,
    )


@settings(max_examples=150, deadline=None)
@given(
    batch=batches(),
    codec=st.sampled_from([tpb.CODEC_ZSTD, tpb.CODEC_NONE]),
    chunk_bytes=st.integers(64, 4096),
)
def test_any_batch_round_trips_unchanged(
    batch: ExperienceBatch, codec: int, chunk_bytes: int
) -> None:
    messages = batch_messages(
        batch, session="s", participant_id="p", sequence=1, chunk_bytes=chunk_bytes, codec=codec
    )

    assert_same_batch(_assemble(messages, DecodeLimits(max_tensors=1)), batch)


SPEC_FIELDS = st.sampled_from(["name", "dtype", "shape"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lying_headers_raise_only_decode_error_within_the_memory_bound(
    data: st.DataObject,
) -> None:
    messages = batch_messages(make_batch(500), session="s", participant_id="p", sequence=1)
    header = messages[0].header
    for _ in range(data.draw(st.integers(1, 4))):
        target = data.draw(
            st.sampled_from(["spec", "transitions", "raw", "encoded", "count", "block"])
        )
        if target == "spec":
            spec = header.column_specs[data.draw(st.integers(0, len(header.column_specs) - 1))]
            field = data.draw(SPEC_FIELDS)
            if field == "name":
                spec.name = data.draw(st.sampled_from(["obs", "action", "reward", "x", ""]))
            elif field == "dtype":
                spec.dtype = data.draw(st.integers(-1, 9))  # type: ignore[assignment]
            else:
                del spec.shape[:]
                spec.shape.extend(data.draw(st.lists(st.integers(-3, 2**40), max_size=4)))
        elif target == "transitions":
            header.transitions = data.draw(st.integers(0, 2**32 - 1))
        elif target == "raw":
            header.block.total_raw_size = data.draw(st.integers(0, 2**63))
        elif target == "encoded":
            header.block.total_encoded_size = data.draw(st.integers(0, 2**63))
        elif target == "count":
            header.block.tensor_count = data.draw(st.integers(0, 2**32 - 1))
        else:
            chunk_header = messages[1].chunk.header
            chunk_header.raw_size = data.draw(st.integers(0, 2**40))
            del chunk_header.shape[:]
            chunk_header.shape.append(data.draw(st.integers(-1, 2**40)))

    with _peak_memory() as peak, contextlib.suppress(DecodeError):
        _assemble(messages)

    # The honest batch decodes in ~25 KB; a lie may cost the limit, never what it claims.
    assert peak[0] < 2 * LIMITS.max_total_raw_bytes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_corrupted_chunks_raise_only_decode_error(data: st.DataObject) -> None:
    messages = batch_messages(
        make_batch(300), session="s", participant_id="p", sequence=1, chunk_bytes=512
    )
    position = data.draw(st.integers(1, len(messages) - 1))
    blob = bytearray(messages[position].chunk.SerializeToString())
    for _ in range(data.draw(st.integers(1, 8))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    try:
        messages[position] = pb.ExperienceChunk(chunk=tpb.TensorChunk.FromString(bytes(blob)))
    except Exception:
        return  # not even a message: the transport refuses it before us

    with contextlib.suppress(DecodeError):
        _assemble(messages)


def _with_block_data(messages: list[pb.ExperienceChunk], data: bytes) -> list[pb.ExperienceChunk]:
    """The batch's header and one chunk carrying `data` as its block, sizes announced to match."""
    header = pb.ExperienceHeader()
    header.CopyFrom(messages[0].header)
    header.block.total_encoded_size = len(data)
    chunk = tpb.TensorChunk(index=0, data=data, last=True)
    chunk.header.CopyFrom(messages[1].chunk.header)
    chunk.header.encoded_size = len(data)
    return [pb.ExperienceChunk(header=header), pb.ExperienceChunk(chunk=chunk)]


def test_a_decompression_bomb_is_refused_within_the_bound() -> None:
    messages = batch_messages(make_batch(2000), session="s", participant_id="p", sequence=1)
    # 256 MiB of zeros in a few kilobytes, announced as one batch of ~86 KB.
    stream = zstandard.ZstdCompressor().compressobj()
    bomb = stream.compress(bytes(256 * MiB)) + stream.flush()
    hostile = _with_block_data(messages, bomb)

    with _peak_memory() as peak, pytest.raises(DecodeError, match="expands to more"):
        _assemble(hostile)

    assert len(bomb) < messages[0].header.block.total_raw_size
    assert peak[0] < 4 * messages[0].header.block.total_raw_size


def test_a_truncated_frame_is_refused() -> None:
    messages = batch_messages(make_batch(2000), session="s", participant_id="p", sequence=1)
    data = messages[1].chunk.data

    with pytest.raises(DecodeError, match="zstd"):
        _assemble(_with_block_data(messages, data[: len(data) // 2]))


def test_a_frame_of_fewer_rows_than_the_specs_announce_is_refused() -> None:
    honest = batch_messages(make_batch(2000), session="s", participant_id="p", sequence=1)
    smaller = batch_messages(make_batch(1000), session="s", participant_id="p", sequence=1)

    with pytest.raises(DecodeError, match="declares"):
        _assemble(_with_block_data(honest, smaller[1].chunk.data))


def test_a_block_larger_than_the_receivers_limit_is_refused_before_any_chunk() -> None:
    messages = batch_messages(make_batch(20_000), session="s", participant_id="p", sequence=1)

    with pytest.raises(DecodeError, match="limit"):
        BatchAssembler(messages[0].header, LIMITS)
