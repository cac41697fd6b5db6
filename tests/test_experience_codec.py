"""Experience batches through the wire format: round trip, encodings, structural refusals."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from test_experience_support import SPEC_HASH, assert_same_batch, make_batch

from fedrl.common.chunking import DecodeLimits, NamedTensors, TensorListAssembler
from fedrl.common.errors import DecodeError
from fedrl.common.experience import (
    COLUMNS,
    ExperienceBatch,
    batch_from_columns,
    batch_messages,
    encode_columns,
)
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb


def _decode(messages: list[pb.ExperienceChunk]) -> ExperienceBatch:
    header = messages[0].header
    assembler = TensorListAssembler(header.columns, DecodeLimits())
    for message in messages[1:]:
        assembler.add(message.chunk)
    return batch_from_columns(header, assembler.result())


def test_batch_round_trips_through_chunked_messages_unchanged() -> None:
    batch = make_batch(3000, n_step=3)

    messages = batch_messages(
        batch, session="s", participant_id="Макар", sequence=7, chunk_bytes=4096
    )

    header = messages[0].header
    assert (header.session, header.participant_id, header.sequence) == ("s", "Макар", 7)
    assert header.transitions == 3000 and header.n_step == 3
    assert all(len(m.chunk.data) <= 4096 for m in messages[1:])
    assert_same_batch(_decode(messages), batch)


def test_columns_travel_in_wire_order_with_actions_narrowed_to_uint8() -> None:
    batch = make_batch(100)

    encoded = encode_columns(batch)

    assert [header.name for header, _ in encoded] == list(COLUMNS)
    dtypes = {header.name: header.dtype for header, _ in encoded}
    assert dtypes["action"] == tpb.DTYPE_UINT8
    assert dtypes["obs"] == tpb.DTYPE_FLOAT32 and dtypes["terminated"] == tpb.DTYPE_BOOL


def test_actions_beyond_uint8_keep_their_values() -> None:
    batch = dataclasses.replace(make_batch(4), action=np.array([0, 300, 70_000, 2**40]))

    decoded = _decode(batch_messages(batch, session="s", participant_id="a", sequence=1))

    np.testing.assert_array_equal(decoded.action, [0, 300, 70_000, 2**40])
    assert decoded.action.dtype == np.int64


def test_columnar_zstd_compresses_cartpole_like_transitions() -> None:
    batch = make_batch(10_000)

    encoded = encode_columns(batch)

    raw = sum(column.nbytes for _, column in batch.columns())
    assert sum(header.encoded_size for header, _ in encoded) < raw / 1.3


def test_missing_column_is_refused_by_name() -> None:
    batch = make_batch(10)
    header = pb.ExperienceHeader(transitions=10, n_step=1, gamma=0.99, env_spec_hash=SPEC_HASH)
    columns = [(name, column) for name, column in batch.columns() if name != "truncated"]

    with pytest.raises(DecodeError, match="truncated"):
        batch_from_columns(header, columns)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda cols: [*cols, ("extra", np.zeros(10))], "unknown experience column 'extra'"),
        (lambda cols: [*cols, cols[0]], "appears twice"),
        (lambda cols: [(n, c[:5]) if n == "reward" else (n, c) for n, c in cols], "announces 10"),
        (
            lambda cols: [(n, c[:, :2]) if n == "next_obs" else (n, c) for n, c in cols],
            "must agree",
        ),
        (
            lambda cols: [(n, c.astype(np.float32)) if n == "action" else (n, c) for n, c in cols],
            "not an integer",
        ),
        (
            lambda cols: [(n, c.astype(np.float64)) if n == "reward" else (n, c) for n, c in cols],
            "'reward' must be float32",
        ),
        (
            lambda cols: [
                (n, c.astype(np.uint8)) if n == "terminated" else (n, c) for n, c in cols
            ],
            "'terminated' must be bool",
        ),
    ],
)
def test_malformed_column_sets_are_refused_with_their_reason(
    change: Callable[[NamedTensors], NamedTensors], reason: str
) -> None:
    batch = make_batch(10)
    header = pb.ExperienceHeader(transitions=10, n_step=1, gamma=0.99, env_spec_hash=SPEC_HASH)

    with pytest.raises(DecodeError, match=reason):
        batch_from_columns(header, change(batch.columns()))


@pytest.mark.parametrize(("n_step", "gamma"), [(0, 0.99), (1, 0.0), (1, 1.5), (1, float("nan"))])
def test_impossible_n_step_or_gamma_is_refused(n_step: int, gamma: float) -> None:
    batch = make_batch(10)
    header = pb.ExperienceHeader(transitions=10, n_step=n_step, gamma=gamma)

    with pytest.raises(DecodeError, match=r"n_step|gamma"):
        batch_from_columns(header, batch.columns())


def test_select_and_concat_keep_rows_and_metadata() -> None:
    batch = make_batch(20, n_step=2)

    joined = ExperienceBatch.concat([batch.select(slice(0, 5)), batch.select(slice(5, 20))])

    assert_same_batch(joined, batch)


def test_concat_refuses_batches_made_differently() -> None:
    with pytest.raises(ValueError, match="different n_step"):
        ExperienceBatch.concat([make_batch(3, n_step=1), make_batch(3, n_step=2)])
