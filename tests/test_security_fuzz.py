"""Fuzzing the server's decoders through a real mTLS channel with hypothesis.

Three generators: raw bytes as messages, well-formed update streams with a
few bytes corrupted, and structurally valid messages with hostile field
values. Whatever arrives, the server must answer with one of the statuses a
client can act on (never UNKNOWN or INTERNAL, which would mean an unhandled
exception), and a refused call must leave the global model as it was.

The default run spends a bounded budget per generator; `-m slow` runs the
same properties for ten times as many examples.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from tests.support.secure_federation import CALL_TIMEOUT_S, SPEC, ZERO, SecureFederation, seeded
from tests.support.server_harness import join, metadata, update_messages

FUZZER = "fuzzer"
BUDGET = 100
SLOW_BUDGET = 1000
ACCEPTABLE = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.ALREADY_EXISTS,
    }
)
"""Statuses that say what was wrong with the request; anything else is a server bug."""
UINT64 = st.integers(0, 2**64 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


def budget(examples: int) -> Callable[[Any], Any]:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


class Target:
    """The module's server, seen from the fuzzing participant."""

    def __init__(self, federation: SecureFederation) -> None:
        self.federation = federation
        self.channel = federation.channel(FUZZER)
        self._sequences = itertools.count(1)

    def next_sequence(self) -> int:
        return next(self._sequences)

    def state(self) -> tuple[int, str]:
        return self.federation.model_hash(FUZZER)

    def valid_update(self) -> list[bytes]:
        version = self.state()[0]
        messages = update_messages(
            FUZZER, SPEC, ZERO, sequence=self.next_sequence(), base_version=version
        )
        return [m.SerializeToString() for m in messages]

    def push(self, messages: list[bytes]) -> pb.PushReply | None:
        """The reply to a raw PushUpdate stream; None when it was refused."""
        method = self.channel.stream_unary(
            "/fedrl.v1.Federation/PushUpdate",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.PushReply.FromString,
        )
        replies: list[pb.PushReply] = []
        self._status(lambda: replies.append(method(iter(messages), **self._call())))
        return replies[0] if replies else None

    def unary(self, name: str, request: bytes) -> None:
        method = self.channel.unary_unary(
            f"/fedrl.v1.Federation/{name}",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        self._status(lambda: method(request, **self._call()))

    def pull(self, request: bytes) -> None:
        method = self.channel.unary_stream(
            "/fedrl.v1.Federation/PullModel",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        self._status(lambda: list(method(request, **self._call())))

    def _call(self) -> dict[str, Any]:
        return {"metadata": metadata(FUZZER), "timeout": CALL_TIMEOUT_S}

    @staticmethod
    def _status(call: Callable[[], object]) -> None:
        """Run a call; a refusal must carry a status the client can act on."""
        try:
            call()
        except grpc.RpcError as exc:
            assert exc.code() in ACCEPTABLE, f"{exc.code()}: {exc.details()}"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    data_dir: Path = tmp_path_factory.mktemp("fuzz")
    with SecureFederation(
        data_dir,
        buffer_size=1,
        chunk_bytes=1 << 16,
        max_message_bytes=1 << 20,
        max_model_bytes=1 << 20,
        push_rate_per_s=1000.0,
        push_burst=1000,
        stream_idle_timeout_s=5.0,
    ) as federation:
        seeded(federation, "owner", SPEC, ZERO)
        join(federation.stub(FUZZER), FUZZER, SPEC)
        yield Target(federation)


def assert_push_is_answered_safely(target: Target, messages: list[bytes]) -> None:
    before = target.state()
    reply = target.push(messages)
    if reply is None:
        assert target.federation.pending() == 0
        assert target.state() == before
    elif not reply.duplicate:
        # Accepted after all (a corruption can be harmless): let it become a
        # version, so the next example starts from a quiet aggregator.
        target.federation.wait_for_version(FUZZER, before[0] + 1)


# Generator 1: raw bytes.

raw_streams = st.lists(st.binary(max_size=300), max_size=4)


def check_raw_bytes(target: Target, stream: list[bytes], request: bytes) -> None:
    assert_push_is_answered_safely(target, stream)
    for name in ("Join", "GetVersion", "Status"):
        target.unary(name, request)
    target.pull(request)


@budget(BUDGET)
@given(stream=raw_streams, request=st.binary(max_size=300))
def test_raw_bytes_get_a_clear_status(target: Target, stream: list[bytes], request: bytes) -> None:
    check_raw_bytes(target, stream, request)


@pytest.mark.slow
@budget(SLOW_BUDGET)
@given(stream=raw_streams, request=st.binary(max_size=300))
def test_raw_bytes_get_a_clear_status_long(
    target: Target, stream: list[bytes], request: bytes
) -> None:
    check_raw_bytes(target, stream, request)


# Generator 2: a valid update with bytes overwritten, messages dropped or repeated.

corruptions = st.lists(
    st.tuples(st.integers(0, 2**16), st.integers(0, 2**16), st.integers(0, 255)),
    min_size=1,
    max_size=6,
)
reshuffles = st.sampled_from(["keep", "drop_last", "repeat_last", "drop_first", "reverse"])


def corrupt(
    messages: list[bytes], edits: list[tuple[int, int, int]], reshuffle: str
) -> list[bytes]:
    mutable = [bytearray(m) for m in messages]
    for which, offset, value in edits:
        message = mutable[which % len(mutable)]
        if message:
            message[offset % len(message)] = value
    out = [bytes(m) for m in mutable]
    if reshuffle == "drop_last":
        return out[:-1]
    if reshuffle == "repeat_last":
        return [*out, out[-1]]
    if reshuffle == "drop_first":
        return out[1:]
    if reshuffle == "reverse":
        return out[::-1]
    return out


@budget(BUDGET)
@given(edits=corruptions, reshuffle=reshuffles)
def test_corrupted_update_stream_gets_a_clear_status(
    target: Target, edits: list[tuple[int, int, int]], reshuffle: str
) -> None:
    assert_push_is_answered_safely(target, corrupt(target.valid_update(), edits, reshuffle))


@pytest.mark.slow
@budget(SLOW_BUDGET)
@given(edits=corruptions, reshuffle=reshuffles)
def test_corrupted_update_stream_gets_a_clear_status_long(
    target: Target, edits: list[tuple[int, int, int]], reshuffle: str
) -> None:
    assert_push_is_answered_safely(target, corrupt(target.valid_update(), edits, reshuffle))


# Generator 3: well-formed messages, hostile values.

tensor_headers = st.builds(
    tpb.TensorHeader,
    name=st.sampled_from(["t0", "t1", "", "x" * 300]) | st.text(max_size=8),
    dtype=st.integers(0, 9),
    shape=st.lists(st.integers(-2, 1 << 20) | INT64, max_size=10),
    codec=st.integers(0, 3),
    raw_size=st.integers(0, 64) | UINT64,
    encoded_size=st.integers(0, 64) | UINT64,
)
chunks = st.builds(
    tpb.TensorChunk,
    index=st.integers(0, 3) | UINT64,
    header=st.none() | tensor_headers,
    data=st.binary(max_size=128) | st.sampled_from([np.ones(6, np.float32).tobytes()]),
    last=st.booleans(),
)
list_headers = st.builds(
    tpb.TensorListHeader,
    tensor_count=st.integers(0, 3) | st.integers(0, 2**32 - 1),
    total_encoded_size=st.integers(0, 256) | UINT64,
    total_raw_size=st.integers(0, 256) | UINT64,
)


@st.composite
def hostile_updates(draw: st.DrawFn) -> list[bytes]:
    header = pb.UpdateHeader(
        session=draw(st.sampled_from(["default", "", "nowhere"]) | st.text(max_size=8)),
        participant_id=draw(st.sampled_from([FUZZER, "owner", ""]) | st.text(max_size=8)),
        sequence=draw(UINT64),
        base_version=draw(st.integers(-2, 3) | INT64),
        env_steps=draw(UINT64),
        episodes=draw(UINT64),
        samples=draw(st.integers(0, 3) | UINT64),
        spec_hash=draw(st.sampled_from([spec_hash(SPEC), ""]) | st.text(max_size=8)),
        tensors=draw(list_headers),
    )
    header.metrics.mean_return = draw(st.floats(allow_nan=True, allow_infinity=True))
    messages = [pb.UpdateChunk(header=header)]
    messages += [pb.UpdateChunk(chunk=c) for c in draw(st.lists(chunks, max_size=4))]
    return [m.SerializeToString() for m in messages]


@budget(BUDGET)
@given(stream=hostile_updates())
def test_hostile_field_values_get_a_clear_status(target: Target, stream: list[bytes]) -> None:
    assert_push_is_answered_safely(target, stream)


@pytest.mark.slow
@budget(SLOW_BUDGET)
@given(stream=hostile_updates())
def test_hostile_field_values_get_a_clear_status_long(target: Target, stream: list[bytes]) -> None:
    assert_push_is_answered_safely(target, stream)
