"""Hostile pushes through a real mTLS channel: each gets its precise status, none moves the model.

One server for the module (buffer_size=1, so an update that got through
would make a new version at once); every case joins its own participant, so
per-participant limits and counters never mix between cases. After each
refused call the test checks the two things an attacker wants to change:
nothing is waiting in the aggregator, and the newest global model has the
same version and the same SHA-256 as before the call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import zstandard

from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from tests.support.secure_federation import (
    CALL_TIMEOUT_S,
    ONES,
    SPEC,
    ZERO,
    SecureFederation,
    rpc_error,
    seeded,
)
from tests.support.server_harness import join, make_spec, metadata, push, seed, update_messages

PUSH_METHOD = "/fedrl.v1.Federation/PushUpdate"
CHUNK_BYTES = 1 << 16
MAX_MESSAGE_BYTES = 1 << 20
IDLE_TIMEOUT_S = 1.0
NORM_BOUND = 1000.0
MAX_SAMPLES = 1000
WIDE_SPEC = make_spec([(1 << 16,)])
"""A 256 KiB model: one tensor larger than a chunk may be."""


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureFederation]:
    data_dir: Path = tmp_path_factory.mktemp("hostile")
    with SecureFederation(
        data_dir,
        buffer_size=1,
        chunk_bytes=CHUNK_BYTES,
        max_message_bytes=MAX_MESSAGE_BYTES,
        stream_idle_timeout_s=IDLE_TIMEOUT_S,
        max_update_norm=NORM_BOUND,
        max_samples=MAX_SAMPLES,
        # Generous: the rate limit has its own test; here it must not mask a case.
        push_rate_per_s=100.0,
        push_burst=100,
    ) as started:
        seeded(started, "owner", SPEC, ZERO)
        stub = started.stub("owner")
        join(stub, "owner", WIDE_SPEC, session="wide")
        seed(stub, "owner", WIDE_SPEC, [np.zeros(1 << 16)], session="wide", chunk_bytes=CHUNK_BYTES)
        yield started


def raw_push(
    federation: SecureFederation, pid: str, messages: Iterator[bytes] | list[bytes]
) -> pb.PushReply:
    """PushUpdate with the stream's bytes exactly as given, bypassing client-side encoding."""
    method = federation.channel(pid).stream_unary(
        PUSH_METHOD,
        request_serializer=lambda raw: raw,
        response_deserializer=pb.PushReply.FromString,
    )
    return method(iter(messages), metadata=metadata(pid), timeout=CALL_TIMEOUT_S)  # type: ignore[no-any-return]


def encoded(messages: list[pb.UpdateChunk]) -> list[bytes]:
    return [m.SerializeToString() for m in messages]


def valid(pid: str, delta: list[np.ndarray] = ONES, **fields: object) -> list[pb.UpdateChunk]:
    """A well-formed update of pid on the default session, base version 0, sequence 1."""
    values: dict[str, object] = {"sequence": 1, "base_version": 0, **fields}
    return update_messages(pid, SPEC, delta, **values)  # type: ignore[arg-type]


def joined(federation: SecureFederation, pid: str) -> str:
    join(federation.stub(pid), pid, SPEC)
    return pid


@dataclass(frozen=True)
class Case:
    """One hostile push: how to build its stream, and the answer it must get."""

    build: Callable[[str], list[bytes]]
    code: grpc.StatusCode
    says: str
    """A word the status details must contain, so the caller learns which check failed."""
    session: str = "default"


# Builders: each takes the (joined) participant id and returns the raw stream.


def malformed_bytes(pid: str) -> list[bytes]:
    # A varint that never ends: no protobuf parser accepts it.
    return [b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"]


def header_then_garbage(pid: str) -> list[bytes]:
    return [*encoded(valid(pid)[:1]), b"\x12\xff\x01garbage"]


def nan_delta(pid: str) -> list[bytes]:
    return encoded(valid(pid, [np.full((3, 2), np.nan), np.ones(2)]))


def inf_delta(pid: str) -> list[bytes]:
    return encoded(valid(pid, [np.ones((3, 2)), np.array([1.0, np.inf])]))


def wrong_shape(pid: str) -> list[bytes]:
    return encoded(valid(pid, [np.ones((2, 3)), np.ones(2)]))


def integer_dtype(pid: str) -> list[bytes]:
    messages = valid(pid)
    # Re-encode the first tensor as int32 with a consistent header: only its dtype is wrong.
    first = messages[1].chunk
    raw = np.ones((3, 2), dtype=np.int32).tobytes()
    first.header.dtype = tpb.DTYPE_INT32
    first.header.codec = tpb.CODEC_NONE
    first.header.raw_size = len(raw)
    delta_encoded = len(raw) - first.header.encoded_size
    first.header.encoded_size = len(raw)
    first.data = raw
    messages[0].header.tensors.total_encoded_size += delta_encoded
    return encoded(messages)


def unknown_dtype(pid: str) -> list[bytes]:
    messages = valid(pid)
    messages[1].chunk.header.dtype = 99  # type: ignore[assignment]
    return encoded(messages)


def decompression_bomb(pid: str) -> list[bytes]:
    """16 MiB of zeros in a zstd frame that hides its size, sent as a 24-byte tensor."""
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(16 << 20))
    messages = valid(pid)
    first = messages[1].chunk
    old = first.header.encoded_size
    first.header.codec = tpb.CODEC_ZSTD
    first.header.encoded_size = len(bomb)
    first.data = bomb
    messages[0].header.tensors.total_encoded_size += len(bomb) - old
    return encoded(messages)


def declared_size_too_large(pid: str) -> list[bytes]:
    messages = valid(pid)
    messages[0].header.tensors.total_raw_size = 2 << 30
    return encoded(messages)


def oversized_chunk(pid: str) -> list[bytes]:
    """The wide model's one tensor in one 256 KiB chunk, four times the chunk limit."""
    # Random values: zstd cannot shrink them below the limit.
    delta = np.random.default_rng(0).standard_normal(1 << 16)
    messages = update_messages(pid, WIDE_SPEC, [delta], sequence=1, base_version=0, session="wide")
    return encoded(messages)


def oversized_message(pid: str) -> list[bytes]:
    header = valid(pid)[0]
    return [header.SerializeToString(), b"\x12" + b"\x80\x80\x80\x01" + bytes(2 << 20)]


def base_from_the_future(pid: str) -> list[bytes]:
    return encoded(valid(pid, base_version=10**6))


def unknown_session(pid: str) -> list[bytes]:
    return encoded(valid(pid, session="nowhere"))


def wrong_spec_hash(pid: str) -> list[bytes]:
    messages = valid(pid)
    messages[0].header.spec_hash = spec_hash(WIDE_SPEC)
    return encoded(messages)


def chunk_index_gap(pid: str) -> list[bytes]:
    messages = valid(pid)
    messages[1].chunk.index = 5
    return encoded(messages)


def chunk_before_header(pid: str) -> list[bytes]:
    return encoded(valid(pid)[1:])


def empty_stream(pid: str) -> list[bytes]:
    return []


def zero_sequence(pid: str) -> list[bytes]:
    return encoded(valid(pid, sequence=0))


def norm_above_bound(pid: str) -> list[bytes]:
    return encoded(valid(pid, [np.full((3, 2), 1e4), np.ones(2)]))


def other_participant(pid: str) -> list[bytes]:
    return encoded(valid("owner"))


CASES: dict[str, Case] = {
    "malformed protobuf": Case(malformed_bytes, grpc.StatusCode.INVALID_ARGUMENT, "malformed"),
    "malformed chunk after header": Case(
        header_then_garbage, grpc.StatusCode.INVALID_ARGUMENT, "malformed"
    ),
    "NaN delta": Case(nan_delta, grpc.StatusCode.INVALID_ARGUMENT, "NaN"),
    "Inf delta": Case(inf_delta, grpc.StatusCode.INVALID_ARGUMENT, "infinite"),
    "wrong shape": Case(wrong_shape, grpc.StatusCode.INVALID_ARGUMENT, "shape"),
    "integer dtype": Case(integer_dtype, grpc.StatusCode.INVALID_ARGUMENT, "floating"),
    "unknown dtype": Case(unknown_dtype, grpc.StatusCode.INVALID_ARGUMENT, "dtype"),
    "decompression bomb": Case(decompression_bomb, grpc.StatusCode.INVALID_ARGUMENT, "expands"),
    "declared size too large": Case(
        declared_size_too_large, grpc.StatusCode.RESOURCE_EXHAUSTED, "max-model-bytes"
    ),
    "oversized chunk": Case(
        oversized_chunk, grpc.StatusCode.RESOURCE_EXHAUSTED, "chunk", session="wide"
    ),
    "oversized message": Case(oversized_message, grpc.StatusCode.RESOURCE_EXHAUSTED, "larger"),
    "base version from the future": Case(
        base_from_the_future, grpc.StatusCode.INVALID_ARGUMENT, "base_version"
    ),
    "unknown session": Case(unknown_session, grpc.StatusCode.NOT_FOUND, "nowhere"),
    "spec hash of another model": Case(
        wrong_spec_hash, grpc.StatusCode.FAILED_PRECONDITION, "spec_hash"
    ),
    "chunk index gap": Case(chunk_index_gap, grpc.StatusCode.INVALID_ARGUMENT, "chunk"),
    "chunk before header": Case(
        chunk_before_header, grpc.StatusCode.INVALID_ARGUMENT, "UpdateHeader"
    ),
    "empty stream": Case(empty_stream, grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    "sequence zero": Case(zero_sequence, grpc.StatusCode.INVALID_ARGUMENT, "sequence"),
    "norm above the bound": Case(norm_above_bound, grpc.StatusCode.INVALID_ARGUMENT, "norm"),
    "another participant's id": Case(
        other_participant, grpc.StatusCode.PERMISSION_DENIED, "act as"
    ),
}


def assert_refused_and_unchanged(
    federation: SecureFederation,
    pid: str,
    stream: Callable[[], Iterator[bytes] | list[bytes]],
    code: grpc.StatusCode,
    says: str,
    *,
    session: str = "default",
) -> None:
    before = federation.model_hash("owner", session)

    with pytest.raises(grpc.RpcError) as info:
        raw_push(federation, pid, stream())

    assert info.value.code() == code, info.value.details()
    assert says in (info.value.details() or ""), info.value.details()
    assert federation.pending(session) == 0
    assert federation.model_hash("owner", session) == before


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_push_gets_its_status_and_leaves_the_model_alone(
    federation: SecureFederation, name: str
) -> None:
    case = CASES[name]
    pid = f"mallory-{name.replace(' ', '-')}"
    join(federation.stub(pid), pid, WIDE_SPEC if case.session == "wide" else SPEC, case.session)

    assert_refused_and_unchanged(
        federation, pid, lambda: case.build(pid), case.code, case.says, session=case.session
    )


def test_never_finished_stream_is_dropped_with_deadline_exceeded(
    federation: SecureFederation,
) -> None:
    pid = joined(federation, "mallory-stalls")
    release = threading.Event()

    def stalled() -> Iterator[bytes]:
        messages = encoded(valid(pid))
        yield messages[0]
        # Hold the stream open far longer than the server's idle timeout.
        release.wait(CALL_TIMEOUT_S)

    try:
        assert_refused_and_unchanged(
            federation, pid, stalled, grpc.StatusCode.DEADLINE_EXCEEDED, "idle timeout"
        )
    finally:
        release.set()


def test_replayed_sequence_gets_the_first_answer_and_is_not_applied_again(
    federation: SecureFederation,
) -> None:
    pid = joined(federation, "replayer")
    stub = federation.stub(pid)
    base = federation.model_hash("owner")[0]
    first = push(stub, pid, SPEC, ONES, sequence=1, base_version=base)
    federation.wait_for_version(pid, base + 1)
    before = federation.model_hash("owner")

    # Same key, different payload: a replay must not smuggle in new tensors.
    replay = raw_push(federation, pid, encoded(valid(pid, [10 * t for t in ONES], base_version=0)))

    assert replay.duplicate and replay.sequence == 1
    assert replay.current_version == first.current_version
    assert replay.weight == first.weight
    assert federation.pending() == 0
    assert federation.model_hash("owner") == before


def test_sequence_below_the_last_acknowledged_is_failed_precondition(
    federation: SecureFederation,
) -> None:
    pid = joined(federation, "rewinder")
    base = federation.model_hash("owner")[0]
    push(federation.stub(pid), pid, SPEC, ONES, sequence=5, base_version=base)
    federation.wait_for_version(pid, base + 1)

    assert_refused_and_unchanged(
        federation,
        pid,
        lambda: encoded(valid(pid, sequence=3, base_version=base)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "sequence",
    )


def test_push_before_join_is_failed_precondition(federation: SecureFederation) -> None:
    pid = "mallory-never-joined"

    assert_refused_and_unchanged(
        federation,
        pid,
        lambda: encoded(valid(pid)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "Join",
    )


def test_claimed_sample_count_is_capped(federation: SecureFederation) -> None:
    pid = joined(federation, "boaster")
    base = federation.model_hash("owner")[0]

    reply = push(
        federation.stub(pid), pid, SPEC, ONES, sequence=1, base_version=base, samples=2**62
    )

    assert 0 < reply.weight <= MAX_SAMPLES


def test_seed_with_nan_leaves_the_session_without_a_model(federation: SecureFederation) -> None:
    pid = "mallory-seeds-nan"
    stub = federation.stub(pid)
    join(stub, pid, SPEC, session="unseeded")

    refused = rpc_error(
        lambda: seed(stub, pid, SPEC, [np.full((3, 2), np.nan), np.ones(2)], session="unseeded")
    )
    joined_again = join(stub, pid, SPEC, session="unseeded")

    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "NaN" in (refused.details() or "")
    assert joined_again.current_version == -1


def test_second_seed_is_already_exists_and_leaves_the_model_alone(
    federation: SecureFederation,
) -> None:
    pid = joined(federation, "mallory-reseeds")
    before = federation.model_hash("owner")

    refused = rpc_error(lambda: seed(federation.stub(pid), pid, SPEC, ONES))

    assert refused.code() == grpc.StatusCode.ALREADY_EXISTS
    assert federation.model_hash("owner") == before
