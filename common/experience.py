"""Experience batches: columnar transitions <-> the ExperienceExchange wire format.

A batch is seven parallel columns, one row per transition (the column names
are fixed by proto/fedrl/v1/experience.proto), each compressed on its own as
one tensor of a TensorChunk stream, so every column gets the decoder's size,
dtype and finiteness checks.

Per-column encodings, chosen by bench/experience.py rather than by guess:
actions travel as the narrowest integer type that holds them (uint8 for any
action space of up to 256 actions) and widen back to int64 on decode;
everything else travels in its own dtype. Byte-shuffling floats first saves
~8% for ~2x the time and would need a new codec on the wire: not worth it.

Measured limit of this format: a column is its own zstd frame, so the
largest redundancy of a batch, next_obs[i] == obs[i + 1], is invisible to
the compressor. CartPole compresses x1.6 this way against x3.1 with next_obs
primed by obs (a protocol extension: see bench/experience.py).

Torch-free: the server stores and validates these batches. Conversion to and
from the client's TransitionBatch lives in fedrl.client.experience_exchange.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fedrl.common.chunking import DEFAULT_CHUNK_BYTES, NamedTensors
from fedrl.common.errors import DecodeError
from fedrl.common.serde import encode_tensor
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

COLUMNS = ("obs", "action", "reward", "next_obs", "discount", "terminated", "truncated")
"""Wire order of the columns; a batch carries exactly these, once each."""

EncodedColumn = tuple[tpb.TensorHeader, bytes]


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

    def __len__(self) -> int:
        return int(self.action.shape[0])

    def columns(self) -> NamedTensors:
        """The columns in wire order."""
        return [(name, getattr(self, name)) for name in COLUMNS]

    def select(self, rows: np.ndarray | slice) -> ExperienceBatch:
        """The batch restricted to some rows (a sample to push, a budget to send)."""
        picked = {name: column[rows] for name, column in self.columns()}
        return ExperienceBatch(
            **picked, n_step=self.n_step, gamma=self.gamma, env_spec_hash=self.env_spec_hash
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
        joined = {name: np.concatenate([getattr(b, name) for b in batches]) for name in COLUMNS}
        return ExperienceBatch(
            **joined, n_step=first.n_step, gamma=first.gamma, env_spec_hash=first.env_spec_hash
        )


def encode_columns(batch: ExperienceBatch, *, codec: int = tpb.CODEC_ZSTD) -> list[EncodedColumn]:
    """Each column's tensor header and encoded bytes, in wire order."""
    return [
        encode_tensor(name, _wire_form(name, column), codec=codec)
        for name, column in batch.columns()
    ]


def _wire_form(name: str, column: np.ndarray) -> np.ndarray:
    if name != "action" or column.size == 0:
        return column
    # uint8 holds any Discrete(n <= 256) action: 8x fewer raw bytes than int64
    # and ~2x fewer after zstd (bench/experience.py, "action as int64").
    low, high = int(column.min()), int(column.max())
    if low >= 0 and high <= np.iinfo(np.uint8).max:
        return column.astype(np.uint8)
    if np.iinfo(np.int32).min <= low and high <= np.iinfo(np.int32).max:
        return column.astype(np.int32)
    return column


def list_header(encoded: Sequence[EncodedColumn]) -> tpb.TensorListHeader:
    """The TensorListHeader announcing these encoded columns."""
    return tpb.TensorListHeader(
        tensor_count=len(encoded),
        total_encoded_size=sum(header.encoded_size for header, _ in encoded),
        total_raw_size=sum(header.raw_size for header, _ in encoded),
    )


def chunk_columns(
    encoded: Sequence[EncodedColumn], *, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> list[tpb.TensorChunk]:
    """Cut encoded columns into TensorChunks of at most chunk_bytes of data each.

    Separate from encoding because the server stores encoded columns and cuts
    them again for each pull, at its own chunk size.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    chunks: list[tpb.TensorChunk] = []
    for header, data in encoded:
        pieces = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]
        for position, piece in enumerate(pieces):
            chunk = tpb.TensorChunk(index=len(chunks), data=piece)
            if position == 0:
                chunk.header.CopyFrom(header)
            chunks.append(chunk)
    if chunks:
        chunks[-1].last = True
    return chunks


def batch_header(
    batch: ExperienceBatch,
    encoded: Sequence[EncodedColumn],
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
        columns=list_header(encoded),
        cursor=cursor,
    )


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
    encoded = encode_columns(batch, codec=codec)
    header = batch_header(
        batch, encoded, session=session, participant_id=participant_id, sequence=sequence
    )
    return [
        pb.ExperienceChunk(header=header),
        *(pb.ExperienceChunk(chunk=c) for c in chunk_columns(encoded, chunk_bytes=chunk_bytes)),
    ]


def batch_from_columns(
    header: pb.ExperienceHeader, columns: Iterable[tuple[str, np.ndarray]]
) -> ExperienceBatch:
    """Build a batch from decoded columns, checking only its structure.

    Structure means: each column exactly once, every column with the header's
    row count, the basic dtypes, n_step and gamma in range. Whether the values
    fit a session's spaces is the server's validation (server/experience_validation.py).
    """
    found: dict[str, np.ndarray] = {}
    for name, column in columns:
        if name not in COLUMNS:
            raise DecodeError(f"unknown experience column {name!r}; expected {list(COLUMNS)}")
        if name in found:
            raise DecodeError(f"experience column {name!r} appears twice")
        found[name] = column
    missing = [name for name in COLUMNS if name not in found]
    if missing:
        raise DecodeError(f"experience batch lacks the column(s) {missing}")
    rows = header.transitions
    for name in COLUMNS:
        column = found[name]
        if column.ndim == 0 or column.shape[0] != rows:
            raise DecodeError(
                f"experience column {name!r} has shape {list(column.shape)}; "
                f"the header announces {rows} transitions"
            )
    if found["obs"].shape != found["next_obs"].shape:
        raise DecodeError(
            f"obs has shape {list(found['obs'].shape)} but next_obs "
            f"{list(found['next_obs'].shape)}; they must agree"
        )
    if found["action"].dtype.kind not in "iu":
        raise DecodeError(f"experience column 'action' is {found['action'].dtype}, not an integer")
    for name in ("reward", "discount"):
        if found[name].dtype != np.float32 or found[name].ndim != 1:
            raise DecodeError(f"experience column {name!r} must be float32 [B]")
    for name in ("terminated", "truncated"):
        if found[name].dtype != np.bool_ or found[name].ndim != 1:
            raise DecodeError(f"experience column {name!r} must be bool [B]")
    if header.n_step < 1:
        raise DecodeError("n_step must be at least 1")
    if not (math.isfinite(header.gamma) and 0.0 < header.gamma <= 1.0):
        raise DecodeError(f"gamma must lie in (0, 1], got {header.gamma}")
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
    )
