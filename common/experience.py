"""Experience batches: columnar transitions <-> the ExperienceExchange wire format.

A batch is seven parallel columns, one row per transition (a two-player
game's adds an eighth, each transition's opponent, as an index into names
the header carries). On the wire the
header describes each column (name, dtype, shape: ExperienceHeader.column_specs)
and the columns' raw little-endian bytes, back to back in wire order, travel
as ONE uint8 tensor of a TensorChunk stream, compressed as one zstd frame.

Why one frame: the largest redundancy of a batch is next_obs[i] == obs[i + 1]
within an episode, and a compressor only finds it when both columns are in
the same frame (and within its window: see WINDOW_LOG). bench/experience.py,
10k transitions: x3.1 in one frame against x1.6 with each column its own
frame on CartPole, x49 against x20 on the trading env.

Wire order: obs, next_obs, then the 4-byte columns, then the 1-byte ones.
Order hardly matters for size: seven orders measured (the former obs,
action, reward, next_obs, ...; next_obs first; small columns first; ...) on
two seeds of CartPole and of the trading env all lie within 0.6% of each
other, this one within 0.2% of the best. It is chosen because every float32
column then starts at an aligned offset whatever the row count, so decoding
hands out views of the block instead of copies.

Per-column encodings, chosen by bench/experience.py rather than by guess:
actions travel as the narrowest integer type that holds them (uint8 for any
action space of up to 256 actions) and widen back to int64 on decode;
everything else travels in its own dtype. Half precision is not a column
dtype: no sender produces it, and observations rounded to 16 bits would be
other states than the ones the sender saw.

Decoding trusts nothing and fails with DecodeError: the column specs are
checked (the seven columns once each in wire order, allowed dtypes, every
shape starting with the row count, sizes adding up to the block) before a
byte is decompressed, the block is decompressed by the bounded decoder to
exactly that size, and the split columns are checked for finiteness and for
bool bytes other than 0/1.

Torch-free: the server stores and validates these batches. Conversion to and
from the client's LearnerTransitions lives in
fedrl.client.training.experience_conversion.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import zstandard

from fedrl.common.chunking import (
    DEFAULT_CHUNK_BYTES,
    DecodeLimits,
    NamedTensors,
    TensorListAssembler,
)
from fedrl.common.codecs import ZSTD_LEVEL
from fedrl.common.errors import DecodeError
from fedrl.common.serde import DTYPE_NAMES, MAX_DIMS, addressable, decode_tensor
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

COLUMNS = ("obs", "next_obs", "reward", "discount", "action", "terminated", "truncated")
"""Wire order of the columns; a batch carries exactly these, once each."""
OPPONENT = "opponent"
"""The column a two-player game's batch adds after the seven: each transition's index into
the header's opponents."""
MAX_OPPONENTS = 1024
"""Opponent names one batch may carry."""
MAX_OPPONENT_NAME = 64
"""Characters of one opponent name at most."""

BLOCK = "columns"
"""Name of the one tensor of a batch's chunk stream: the columns' bytes back to back."""

WINDOW_LOG = 25
"""log2 of the zstd window of a batch's frame (32 MiB; the frame shrinks it to its size).

zstd's window at level 3 is 2 MiB, and next_obs[i] == obs[i + 1] lies one obs
column apart, out of reach once that column passes 2 MiB (10k transitions of
the trading env: x21 instead of x49, and twice the compression time). 32 MiB
reaches across the obs column of any batch the server accepts (64 MiB at
most); small batches pay nothing, and decoders accept windows up to 128 MiB
(fedrl.common.codecs).
"""

# How each allowed column dtype lies in the block (little-endian).
_STORAGE: dict[int, np.dtype[np.generic]] = {
    tpb.DTYPE_FLOAT32: np.dtype("<f4"),
    tpb.DTYPE_INT64: np.dtype("<i8"),
    tpb.DTYPE_INT32: np.dtype("<i4"),
    tpb.DTYPE_UINT8: np.dtype("u1"),
    tpb.DTYPE_BOOL: np.dtype("?"),
}
_CODES: dict[np.dtype[np.generic], int] = {dtype: code for code, dtype in _STORAGE.items()}
_ANY = frozenset(_STORAGE)
_ALLOWED: dict[str, frozenset[int]] = {
    # Observations in any dtype a Box may have; the server checks the session's.
    "obs": _ANY,
    "next_obs": _ANY,
    "reward": frozenset({tpb.DTYPE_FLOAT32}),
    "discount": frozenset({tpb.DTYPE_FLOAT32}),
    "action": frozenset({tpb.DTYPE_UINT8, tpb.DTYPE_INT32, tpb.DTYPE_INT64}),
    "terminated": frozenset({tpb.DTYPE_BOOL}),
    "truncated": frozenset({tpb.DTYPE_BOOL}),
    OPPONENT: frozenset({tpb.DTYPE_UINT8, tpb.DTYPE_INT32}),
}
# Columns with one value per transition: shape exactly [transitions].
_SCALAR = frozenset((*COLUMNS, OPPONENT)) - {"obs", "next_obs"}
_LOCAL = threading.local()
_DEFAULT_LIMITS = DecodeLimits()


@dataclass(frozen=True)
class ExperienceBatch:
    """B transitions of one participant, as numpy columns, with how they were made."""

    obs: np.ndarray
    """[B, *obs_shape] in the observation space's dtype: where the action was taken."""
    action: np.ndarray
    """int64 [B]: the discrete action taken."""
    reward: np.ndarray
    """float32 [B]: the n-step discounted reward sum."""
    next_obs: np.ndarray
    """[B, *obs_shape]: the observation k <= n steps later (the bootstrap state)."""
    discount: np.ndarray
    """float32 [B]: gamma**k to bootstrap with; 0.0 where the episode terminated."""
    terminated: np.ndarray
    """bool [B]: the episode ended inside the n steps (no bootstrap)."""
    truncated: np.ndarray
    """bool [B]: a time limit cut the episode inside the n steps (still bootstraps)."""
    n_step: int
    """Steps folded into each reward (1 for plain transitions)."""
    gamma: float
    """Per-step discount the rewards and discounts were computed with."""
    env_spec_hash: str
    """Spec hash of the session the transitions were collected for."""
    opponent: np.ndarray | None = None
    """Two-player games: int [B], each transition's index into `opponents`; None elsewhere."""
    opponents: tuple[str, ...] = ()
    """Two-player games: the opponents' names, as the sender gives them."""

    def __len__(self) -> int:
        return int(self.action.shape[0])

    def columns(self) -> NamedTensors:
        """The columns in wire order."""
        columns = [(name, getattr(self, name)) for name in COLUMNS]
        if self.opponent is not None:
            columns.append((OPPONENT, self.opponent))
        return columns

    def select(self, rows: np.ndarray | slice) -> ExperienceBatch:
        """The batch restricted to some rows (a budget to send)."""
        picked = {name: column[rows] for name, column in self.columns()}
        return ExperienceBatch(
            **picked,
            n_step=self.n_step,
            gamma=self.gamma,
            env_spec_hash=self.env_spec_hash,
            opponents=self.opponents,
        )

    @staticmethod
    def concat(batches: Sequence[ExperienceBatch]) -> ExperienceBatch:
        """Join batches made the same way (same n_step, gamma and spec) end to end."""
        if not batches:
            raise ValueError("ExperienceBatch.concat needs at least one batch")
        first = batches[0]
        for other in batches[1:]:
            if (other.n_step, other.gamma, other.env_spec_hash) != (
                first.n_step,
                first.gamma,
                first.env_spec_hash,
            ):
                raise ValueError("cannot join batches with different n_step, gamma or spec hash")
        joined: dict[str, Any] = {
            name: np.concatenate([getattr(b, name) for b in batches]) for name in COLUMNS
        }
        if all(b.opponent is None for b in batches):
            return ExperienceBatch(
                **joined, n_step=first.n_step, gamma=first.gamma, env_spec_hash=first.env_spec_hash
            )
        if any(b.opponent is None for b in batches):
            raise ValueError("cannot join a two-player game's batches with other batches")
        # One list of names for all: each batch's indices move to their name's place in it.
        names = list(dict.fromkeys(name for b in batches for name in b.opponents))
        place = {name: index for index, name in enumerate(names)}
        opponent = np.concatenate(
            [
                np.asarray([place[name] for name in b.opponents], dtype=np.int32)[b.opponent]
                for b in batches
                if b.opponent is not None
            ]
        )
        return ExperienceBatch(
            **joined,
            n_step=first.n_step,
            gamma=first.gamma,
            env_spec_hash=first.env_spec_hash,
            opponent=opponent,
            opponents=tuple(names),
        )


@dataclass(frozen=True)
class EncodedBatch:
    """A batch's columns in wire form: their descriptions and the one encoded block."""

    column_specs: list[tpb.TensorSpec]
    """Name, dtype and shape of each column, in wire order."""
    block: tpb.TensorHeader
    """Header of the block tensor (uint8, the columns' raw bytes back to back)."""
    data: bytes
    """The block's encoded bytes."""


# Encoding.


def encode_batch(batch: ExperienceBatch, *, codec: int = tpb.CODEC_ZSTD) -> EncodedBatch:
    """The batch's column specs and its columns encoded as one block."""
    wire = [_wire_form(name, column) for name, column in batch.columns()]
    raw_size = sum(column.nbytes for column, _ in wire)
    parts = [column.reshape(-1).view(np.uint8).data for column, _ in wire]
    if codec == tpb.CODEC_ZSTD:
        data = _zstd_frame(parts, raw_size)
    elif codec == tpb.CODEC_NONE:
        data = b"".join(parts)
    else:
        raise ValueError(f"unknown codec {codec}; use CODEC_ZSTD or CODEC_NONE")
    block = tpb.TensorHeader(
        name=BLOCK,
        dtype=tpb.DTYPE_UINT8,
        shape=[raw_size],
        codec=cast(tpb.Codec, codec),
        raw_size=raw_size,
        encoded_size=len(data),
    )
    return EncodedBatch(column_specs=[spec for _, spec in wire], block=block, data=data)


def _zstd_frame(parts: Sequence[memoryview], raw_size: int) -> bytes:
    """One zstd frame of the parts back to back, streamed from the columns themselves.

    Streaming skips packing the columns into a block first: that fresh
    buffer alone cost as much as the compression here (page faults of a new
    allocation; bench/experience.py went from ~900 to ~450 µs per 10k).
    The frame declares its size, as a one-shot frame does.
    """
    stream = _compressor().compressobj(size=raw_size)
    pieces = [stream.compress(part) for part in parts]
    pieces.append(stream.flush())
    return b"".join(pieces)


def _compressor() -> zstandard.ZstdCompressor:
    # One per thread, as in fedrl.common.codecs: a compressor holds one native
    # context, and sharing it between threads crashes the process.
    compressor: zstandard.ZstdCompressor | None = getattr(_LOCAL, "compressor", None)
    if compressor is None:
        params = zstandard.ZstdCompressionParameters.from_level(ZSTD_LEVEL, window_log=WINDOW_LOG)
        compressor = _LOCAL.compressor = zstandard.ZstdCompressor(compression_params=params)
    return compressor


def _wire_form(name: str, column: np.ndarray) -> tuple[np.ndarray, tpb.TensorSpec]:
    """The column as it travels (contiguous, little-endian, actions and opponents narrowed) and
    its spec."""
    if name == OPPONENT:
        column = column.astype(np.uint8 if not column.size or column.max() < 256 else np.int32)
    if name == "action" and column.size:
        # uint8 holds any Discrete(n <= 256) action: 8x fewer raw bytes than int64
        # and ~2x fewer after zstd (bench/experience.py).
        low, high = int(column.min()), int(column.max())
        if low >= 0 and high <= np.iinfo(np.uint8).max:
            column = column.astype(np.uint8)
        elif np.iinfo(np.int32).min <= low and high <= np.iinfo(np.int32).max:
            column = column.astype(np.int32)
    code = _CODES.get(column.dtype)
    if code is None or code not in _ALLOWED[name]:
        allowed = sorted(DTYPE_NAMES[c] for c in _ALLOWED[name])
        raise ValueError(f"experience column {name!r} is {column.dtype}; it may be {allowed}")
    spec = tpb.TensorSpec(name=name, dtype=cast(tpb.DType, code), shape=list(column.shape))
    return np.ascontiguousarray(column, dtype=_STORAGE[code]), spec


def batch_header(
    batch: ExperienceBatch,
    encoded: EncodedBatch,
    *,
    session: str,
    participant_id: str,
    sequence: int,
    cursor: int = 0,
) -> pb.ExperienceHeader:
    """The ExperienceHeader that goes before the batch's chunks."""
    return pb.ExperienceHeader(
        session=session,
        participant_id=participant_id,
        sequence=sequence,
        env_spec_hash=batch.env_spec_hash,
        transitions=len(batch),
        n_step=batch.n_step,
        gamma=batch.gamma,
        cursor=cursor,
        column_specs=encoded.column_specs,
        opponents=list(batch.opponents),
        block=tpb.TensorListHeader(
            tensor_count=1,
            total_encoded_size=encoded.block.encoded_size,
            total_raw_size=encoded.block.raw_size,
        ),
    )


def chunk_block(
    block: tpb.TensorHeader, data: bytes, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> list[tpb.TensorChunk]:
    """Cut an encoded block into TensorChunks of at most chunk_bytes of data each.

    Separate from encoding because the server stores encoded blocks and cuts
    them again for each pull, at its own chunk size.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    pieces = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]
    chunks = [tpb.TensorChunk(index=index, data=piece) for index, piece in enumerate(pieces)]
    chunks[0].header.CopyFrom(block)
    chunks[-1].last = True
    return chunks


def batch_messages(
    batch: ExperienceBatch,
    *,
    session: str,
    participant_id: str,
    sequence: int,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    codec: int = tpb.CODEC_ZSTD,
) -> list[pb.ExperienceChunk]:
    """The stream messages of one batch: its header, then its chunks."""
    encoded = encode_batch(batch, codec=codec)
    header = batch_header(
        batch, encoded, session=session, participant_id=participant_id, sequence=sequence
    )
    chunks = chunk_block(encoded.block, encoded.data, chunk_bytes=chunk_bytes)
    return [pb.ExperienceChunk(header=header), *(pb.ExperienceChunk(chunk=c) for c in chunks)]


# Decoding.


@dataclass(frozen=True)
class ColumnSlot:
    """Where one column lies in the decoded block, and what it is."""

    name: str
    """Column name, one of COLUMNS."""
    storage: np.dtype[np.generic]
    """Element type in the block."""
    shape: tuple[int, ...]
    """Shape, starting with the batch's transitions."""
    offset: int
    """First byte in the block."""
    size: int
    """Bytes in the block."""


def column_layout(header: pb.ExperienceHeader, *, max_raw_bytes: int) -> list[ColumnSlot]:
    """Check a batch header's description of its columns and return where each lies.

    Everything here is checked before a byte is decompressed, so a lying
    header costs the receiver nothing but this call.
    """
    names = [spec.name for spec in header.column_specs]
    if not names:
        raise DecodeError(
            "the batch header describes no columns (column_specs is empty); "
            "the sender speaks another experience format"
        )
    expected = [*COLUMNS, OPPONENT] if header.opponents else list(COLUMNS)
    if names != expected:
        raise DecodeError(
            f"experience columns must be {expected} in this order, got {names[:16]}"
            + ("" if header.opponents else " (an opponent column comes with opponent names)")
        )
    _check_opponent_names(header.opponents)
    if header.n_step < 1:
        raise DecodeError("n_step must be at least 1")
    if not (math.isfinite(header.gamma) and 0.0 < header.gamma <= 1.0):
        raise DecodeError(f"gamma must lie in (0, 1], got {header.gamma}")
    slots: list[ColumnSlot] = []
    offset = 0
    for spec in header.column_specs:
        slot = _slot(spec, header.transitions, offset)
        offset += slot.size
        if offset > max_raw_bytes:
            raise DecodeError(
                f"the batch's columns take more than the limit of {max_raw_bytes} bytes"
            )
        slots.append(slot)
    obs, next_obs = slots[0], slots[1]
    if (obs.storage, obs.shape) != (next_obs.storage, next_obs.shape):
        raise DecodeError(
            f"obs is {obs.storage.name} {list(obs.shape)} but next_obs "
            f"{next_obs.storage.name} {list(next_obs.shape)}; they must agree"
        )
    block = header.block
    if block.tensor_count != 1:
        raise DecodeError(
            f"a batch travels as one block tensor, the header announces {block.tensor_count}"
        )
    if block.total_raw_size != offset:
        raise DecodeError(
            f"the columns take {offset} bytes but the block header says {block.total_raw_size}"
        )
    return slots


def _check_opponent_names(names: Sequence[str]) -> None:
    if len(names) > MAX_OPPONENTS:
        raise DecodeError(f"a batch names {len(names)} opponents; at most {MAX_OPPONENTS}")
    for name in names:
        if not 1 <= len(name) <= MAX_OPPONENT_NAME or not name.isprintable():
            raise DecodeError(
                f"opponent names must be 1..{MAX_OPPONENT_NAME} printable characters, "
                f"got {name[:80]!r}"
            )


def _slot(spec: tpb.TensorSpec, rows: int, offset: int) -> ColumnSlot:
    label = f"experience column {spec.name!r}"
    if spec.dtype not in _ALLOWED[spec.name]:
        allowed = sorted(DTYPE_NAMES[code] for code in _ALLOWED[spec.name])
        got = DTYPE_NAMES.get(spec.dtype, str(spec.dtype))
        raise DecodeError(f"{label} is {got}; it may be {allowed}")
    shape = tuple(spec.shape)
    if spec.name in _SCALAR and len(shape) != 1:
        raise DecodeError(f"{label} must have shape [transitions], got {list(shape)}")
    if not 1 <= len(shape) <= MAX_DIMS or any(dim < 0 for dim in shape):
        raise DecodeError(f"{label} has impossible shape {list(shape)}")
    if shape[0] != rows:
        raise DecodeError(
            f"{label} has shape {list(shape)}; the header announces {rows} transitions"
        )
    storage = _STORAGE[spec.dtype]
    if not addressable(shape, storage.itemsize):
        raise DecodeError(
            f"{label} has shape {list(shape)}, too large for any array, even an empty one"
        )
    return ColumnSlot(spec.name, storage, shape, offset, math.prod(shape) * storage.itemsize)


def _check_block_header(block: tpb.TensorHeader, raw_size: int) -> None:
    """Refuse a block tensor header that is not the one a batch header announced."""
    if block.name != BLOCK or block.dtype != tpb.DTYPE_UINT8 or list(block.shape) != [raw_size]:
        raise DecodeError(
            f"a batch's stream carries one tensor {BLOCK!r} of uint8 [{raw_size}], got "
            f"{block.name!r} of {DTYPE_NAMES.get(block.dtype, block.dtype)} {list(block.shape)}"
        )


def _split_block(
    header: pb.ExperienceHeader,
    layout: Sequence[ColumnSlot],
    block: np.ndarray,
    *,
    require_finite: bool = True,
) -> ExperienceBatch:
    """The batch whose columns are views of a decoded block laid out as `layout` says."""
    found: dict[str, np.ndarray] = {}
    for slot in layout:
        raw = block[slot.offset : slot.offset + slot.size]
        if slot.storage == np.bool_ and raw.size and raw.max() > 1:
            # Any byte other than 0/1 is not a bool numpy would have written.
            raise DecodeError(f"experience column {slot.name!r}: bool bytes must be 0 or 1")
        column = raw.view(slot.storage).reshape(slot.shape)
        # A view at an odd offset (a uint8 observation space) is copied once
        # so that consumers get aligned arrays.
        column = np.require(column, dtype=slot.storage.newbyteorder("="), requirements="A")
        if require_finite and column.dtype.kind == "f" and not np.isfinite(column).all():
            raise DecodeError(f"experience column {slot.name!r} holds NaN or infinite values")
        found[slot.name] = column
    opponent = found.get(OPPONENT)
    if opponent is not None and opponent.size and int(opponent.max()) >= len(header.opponents):
        raise DecodeError(
            f"experience column {OPPONENT!r} names opponent {int(opponent.max())} of "
            f"{len(header.opponents)}"
        )
    if opponent is not None and opponent.size and int(opponent.min()) < 0:
        raise DecodeError(f"experience column {OPPONENT!r} holds a negative index")
    return ExperienceBatch(
        obs=found["obs"],
        action=found["action"].astype(np.int64, copy=False),
        reward=found["reward"],
        next_obs=found["next_obs"],
        discount=found["discount"],
        terminated=found["terminated"],
        truncated=found["truncated"],
        n_step=header.n_step,
        gamma=header.gamma,
        env_spec_hash=header.env_spec_hash,
        opponent=None if opponent is None else opponent.astype(np.int32, copy=False),
        opponents=tuple(header.opponents),
    )


def decode_batch(
    header: pb.ExperienceHeader,
    block: tpb.TensorHeader,
    data: bytes | bytearray | memoryview,
    *,
    limits: DecodeLimits = _DEFAULT_LIMITS,
) -> ExperienceBatch:
    """Decode a batch whose block is at hand whole (a stored batch)."""
    layout = column_layout(header, max_raw_bytes=limits.max_total_raw_bytes)
    _check_block_header(block, header.block.total_raw_size)
    if block.encoded_size != header.block.total_encoded_size:
        raise DecodeError(
            f"block of {block.encoded_size} encoded bytes, the batch header says "
            f"{header.block.total_encoded_size}"
        )
    values = decode_tensor(block, data, max_raw_bytes=header.block.total_raw_size)
    return _split_block(header, layout, values, require_finite=limits.require_finite)


class BatchAssembler:
    """Rebuilds one batch from its header and chunk stream, refusing anything out of line.

    The header's column specs are checked on construction, before any chunk;
    the chunk stream itself is checked by TensorListAssembler (order, sizes,
    bounded decompression).
    """

    def __init__(self, header: pb.ExperienceHeader, limits: DecodeLimits = _DEFAULT_LIMITS) -> None:
        self._header = header
        self._layout = column_layout(header, max_raw_bytes=limits.max_total_raw_bytes)
        self._require_finite = limits.require_finite
        self._stream = TensorListAssembler(header.block, limits)

    @property
    def complete(self) -> bool:
        """True once the final chunk arrived and the block decoded."""
        return self._stream.complete

    def add(self, chunk: tpb.TensorChunk) -> None:
        """Take the next chunk of the stream."""
        if chunk.HasField("header"):
            _check_block_header(chunk.header, self._header.block.total_raw_size)
        self._stream.add(chunk)

    def result(self) -> ExperienceBatch:
        """The decoded batch; DecodeError if the stream was cut short or a column is bad."""
        ((_, block),) = self._stream.result()
        return _split_block(self._header, self._layout, block, require_finite=self._require_finite)
