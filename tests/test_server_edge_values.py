"""Every field of every request at the edges of its type, each call followed by a restart.

A valid request of each RPC has one of its fields (at any depth: the spec's
tensors, the metrics, a stream's first chunk and its tensor header...) set
to each edge value of the field's type in turn, and hypothesis sets one to
three of them at once: 0, 1, the type's maximum, 2^63, 2^64-1,
negatives where signed, NaN and infinities, empty, very long and Unicode
strings, unknown enum numbers; top-level strings are also sent as bytes that
are not UTF-8. Whatever the call did, the server must:

- answer OK or a status that says what was wrong (never UNKNOWN, INTERNAL
  or UNAVAILABLE, which would be an unhandled exception or a dead server);
- stop and start again on the same data dir (no record it logged kills its
  recovery), answer Status, and serve the same global model as before the
  call, unless the call was answered OK.

Every run draws 40 combined calls per RPC; `-m slow` adds the one-field
sweep (about 650 calls, each with a restart of the in-process server, a fifth
of the default tests' CPU were it among them) and ten times more combined
calls.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrl.common.experience import batch_messages
from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import experience_pb2 as xpb
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.experience.service import experience_service
from tests.support.experience import CONFIG, cartpole_spec, make_batch
from tests.support.server_harness import (
    InProcessServer,
    channel,
    join,
    metadata,
    pull,
    seed,
    server_config,
    update_messages,
)

CALLER = "alice"
OTHER = "bob"
SPEC = cartpole_spec()
SPEC_HASH = spec_hash(SPEC)
BUDGET = 40
"""Calls per RPC in the default run."""
SLOW_BUDGET = 400
CALL_TIMEOUT_S = 30
ACCEPTABLE = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.ALREADY_EXISTS,
    }
)

_C = FieldDescriptor
EDGES: dict[int, list[Any]] = {
    _C.CPPTYPE_UINT64: [0, 1, 2**32 - 1, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1],
    _C.CPPTYPE_INT64: [-(2**63), -(2**62), -2, -1, 0, 1, 2**62, 2**63 - 1],
    _C.CPPTYPE_UINT32: [0, 1, 2**31, 2**32 - 1],
    _C.CPPTYPE_INT32: [-(2**31), -1, 0, 1, 2**31 - 1],
    _C.CPPTYPE_DOUBLE: [0.0, -0.0, 5e-324, 1e30, 3e38, 1e308, -1e308, np.inf, -np.inf, np.nan],
    _C.CPPTYPE_FLOAT: [0.0, 1.0, 3e38, -np.inf, np.nan],
    _C.CPPTYPE_BOOL: [False, True],
    _C.CPPTYPE_ENUM: [0, 1, 2, 3, 99, -1],
}
STRINGS = ["", "default", CALLER, OTHER, "Макар", "x" * 70_000, "\x00", "a/../b", " "]
BYTES = [b"", b"\x00", b"\xff" * 1024, np.ones(8, np.float32).tobytes()]
NOT_UTF8 = b"\xff\xfe\xc3"


def leaves(message: Message, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every scalar field of `message`, inside set sub-messages and first elements."""
    for field in message.DESCRIPTOR.fields:
        path = (*prefix, field.name)
        if field.cpp_type == _C.CPPTYPE_MESSAGE:
            value = getattr(message, field.name)
            if field.is_repeated:
                if len(value):
                    yield from leaves(value[0], (*path, 0))
            else:
                yield from leaves(value, path)
        else:
            yield path


def field_at(message: Message, path: tuple[Any, ...]) -> tuple[Message, FieldDescriptor]:
    """The message holding the field at `path`, and the field."""
    holder: Any = message
    for step in path[:-1]:
        holder = holder[step] if isinstance(step, int) else getattr(holder, step)
    return holder, holder.DESCRIPTOR.fields_by_name[path[-1]]


def values_for(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.cpp_type == _C.CPPTYPE_STRING:
        scalar = st.sampled_from(BYTES if field.type == _C.TYPE_BYTES else STRINGS)
    else:
        scalar = st.sampled_from(EDGES[field.cpp_type])
    if field.is_repeated:
        return st.one_of(
            st.just([]), st.lists(scalar, min_size=1, max_size=3), scalar.map(lambda v: [v] * 5000)
        )
    return scalar


def set_field(message: Message, path: tuple[Any, ...], value: Any) -> None:
    holder, field = field_at(message, path)
    if field.is_repeated:
        del getattr(holder, field.name)[:]
        getattr(holder, field.name).extend(value)
    else:
        setattr(holder, field.name, value)


@st.composite
def edits(draw: st.DrawFn, message: Message) -> list[tuple[tuple[Any, ...], Any]]:
    """One to three (path, value) edits of `message`'s fields."""
    paths = sorted(set(leaves(message)), key=repr)
    chosen = draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3, unique=True))
    return [(path, draw(values_for(field_at(message, path)[1]))) for path in chosen]


def not_utf8(message: Message) -> bytes | None:
    """The message with its first top-level string field's bytes replaced by invalid UTF-8."""
    for field in message.DESCRIPTOR.fields:
        if field.type == _C.TYPE_STRING and not field.is_repeated:
            # A field seen twice on the wire takes the last value: append it.
            tag = bytes([field.number << 3 | 2])
            return message.SerializeToString() + tag + bytes([len(NOT_UTF8)]) + NOT_UTF8
    return None


@dataclasses.dataclass
class Call:
    """One RPC made of messages whose first is the one the edits go to."""

    rpc: str
    messages: list[Message]
    kind: str
    """unary, server_stream or client_stream."""
    service: str = "fedrl.v1.Federation"
    reply: Callable[[bytes], Any] = lambda raw: raw


class Node:
    """The data dir, the server on it now, and what the model looked like after the last call."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.server = self._start()
        self.sequences = itertools.count(1)
        self.experience_sequences = itertools.count(1)
        stub = self.server.stub()
        for pid in (CALLER, OTHER):
            join(stub, pid, SPEC)
        seed(stub, CALLER, SPEC, [np.full(t.shape, 0.5, np.float32) for t in SPEC.tensors])
        self.model = self.model_state()

    def _start(self) -> InProcessServer:
        service = experience_service(self.data_dir, CONFIG)
        config = server_config(
            self.data_dir, buffer_size=1, push_rate_per_s=1000.0, push_burst=1000
        )
        return InProcessServer(config, extra_services=[service]).start()

    def restart(self) -> None:
        self.server.stop()
        self.server = self._start()

    def model_state(self) -> tuple[int, str]:
        header, tensors, _ = pull(self.server.stub(), participant_id=CALLER)
        digest = hashlib.sha256(b"".join(t.astype(np.float32).tobytes() for t in tensors))
        return header.version, digest.hexdigest()

    def valid_calls(self) -> list[Call]:
        version = self.model[0]
        delta = [np.full(t.shape, 0.01, np.float32) for t in SPEC.tensors]
        update = update_messages(
            CALLER, SPEC, delta, sequence=next(self.sequences), base_version=version
        )
        experience = batch_messages(
            make_batch(8),
            session="default",
            participant_id=CALLER,
            sequence=next(self.experience_sequences),
        )
        return [
            Call(
                "Join",
                [
                    pb.JoinRequest(
                        session="default",
                        participant_id=CALLER,
                        spec=SPEC,
                        spec_hash=SPEC_HASH,
                        client_version="0",
                    )
                ],
                "unary",
            ),
            Call(
                "Leave",
                [pb.LeaveRequest(session="default", participant_id=CALLER, reason="edge")],
                "unary",
            ),
            Call("PushUpdate", [update[0].header, *(m.chunk for m in update[1:])], "client_stream"),
            Call(
                "SeedModel",
                [
                    pb.ModelUploadHeader(
                        session="default",
                        participant_id=CALLER,
                        spec_hash=SPEC_HASH,
                        tensors=update[0].header.tensors,
                    ),
                    *(m.chunk for m in update[1:]),
                ],
                "client_stream",
            ),
            Call(
                "PullModel",
                [
                    pb.PullModelRequest(
                        session="default",
                        participant_id=CALLER,
                        version=-1,
                        have_version=-1,
                        dtype=tpb.DTYPE_FLOAT32,
                        codec=tpb.CODEC_ZSTD,
                    )
                ],
                "server_stream",
            ),
            Call("Status", [pb.StatusRequest(session="default", max_versions=5)], "unary"),
            Call(
                "GetVersion",
                [pb.GetVersionRequest(session="default", participant_id=CALLER)],
                "unary",
            ),
            Call(
                "WatchVersions",
                [pb.GetVersionRequest(session="default", participant_id=CALLER)],
                "server_stream",
            ),
            Call(
                "RaiseGoal",
                [
                    pb.RaiseGoalRequest(
                        session="default", participant_id=CALLER, total_episodes=2000
                    )
                ],
                "unary",
            ),
            Call(
                "PushExperience",
                [experience[0].header, *(m.chunk for m in experience[1:])],
                "client_stream",
                service="fedrl.v1.ExperienceExchange",
            ),
            Call(
                "PullExperience",
                [
                    xpb.PullExperienceRequest(
                        session="default",
                        participant_id=CALLER,
                        cursor=0,
                        max_transitions=100,
                        codec=tpb.CODEC_ZSTD,
                    )
                ],
                "server_stream",
                service="fedrl.v1.ExperienceExchange",
            ),
        ]

    def send(self, call: Call, wire: list[bytes]) -> grpc.StatusCode:
        """Make the call with these message bytes; the status it ended with."""
        with channel(self.server.address) as opened:
            method = f"/{call.service}/{call.rpc}"
            options: dict[str, Any] = {"metadata": metadata(CALLER), "timeout": CALL_TIMEOUT_S}
            raw = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
            try:
                if call.kind == "unary":
                    opened.unary_unary(method, **raw)(wire[0], **options)
                elif call.kind == "server_stream":
                    stream = opened.unary_stream(method, **raw)(wire[0], **options)
                    if call.rpc == "WatchVersions":
                        next(stream)
                        stream.cancel()
                    else:
                        list(stream)
                else:
                    opened.stream_unary(method, **raw)(iter(wire), **options)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.CANCELLED and call.rpc == "WatchVersions":
                    return grpc.StatusCode.OK
                assert exc.code() in ACCEPTABLE, f"{call.rpc}: {exc.code()}: {exc.details()}"
                return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    def stop(self) -> None:
        self.server.stop()


def _wrapped(rpc: str, message: Message) -> bytes:
    """A stream's later message (a chunk) in its RPC's oneof wrapper."""
    if rpc == "PushUpdate":
        return pb.UpdateChunk(chunk=message).SerializeToString()
    if rpc == "SeedModel":
        return pb.ModelUpload(chunk=message).SerializeToString()
    return xpb.ExperienceChunk(chunk=message).SerializeToString()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    started = Node(tmp_path_factory.mktemp("edges"))
    yield started
    started.stop()


RPCS = [
    "Join",
    "Leave",
    "PushUpdate",
    "SeedModel",
    "PullModel",
    "Status",
    "GetVersion",
    "WatchVersions",
    "RaiseGoal",
    "PushExperience",
    "PullExperience",
]
"""Every RPC of both services (Node.valid_calls has a valid request of each)."""


def edit_targets(call: Call) -> list[Message]:
    """The messages whose fields are edited: the first, and a stream's first chunk."""
    return call.messages[:2] if call.kind == "client_stream" else call.messages[:1]


def all_edits(call: Call) -> Iterator[tuple[int, tuple[Any, ...], Any]]:
    """(message index, path, value) for every leaf field of the targets and every edge value."""
    for index, message in enumerate(edit_targets(call)):
        for path in sorted(set(leaves(message)), key=repr):
            field = field_at(message, path)[1]
            if field.cpp_type == _C.CPPTYPE_STRING:
                values: list[Any] = BYTES if field.type == _C.TYPE_BYTES else STRINGS
            else:
                values = EDGES[field.cpp_type]
            for value in values:
                yield index, path, [value] if field.is_repeated else value


def wire(call: Call, raw_first: bytes | None = None) -> list[bytes]:
    """The call's messages as bytes, in their stream wrappers; raw_first replaces the first."""
    first = call.messages[0].SerializeToString() if raw_first is None else raw_first
    if call.kind != "client_stream":
        return [first]
    # Field 1 of every upload wrapper is its header (length-delimited), field 2 a chunk.
    return [
        b"\x0a" + _varint(len(first)) + first,
        *(_wrapped(call.rpc, m) for m in call.messages[1:]),
    ]


def check_call(node: Node, call: Call, messages: list[bytes]) -> None:
    """Send, restart, and check: a clear status, a server that serves, the model as it was."""
    code = node.send(call, messages)
    node.restart()

    node.server.stub().Status(pb.StatusRequest(), metadata=metadata(CALLER), timeout=CALL_TIMEOUT_S)
    state = node.model_state()
    if code != grpc.StatusCode.OK:
        assert state == node.model, f"{call.rpc} was refused ({code}) but the model changed"
    node.model = state


def call_named(node: Node, rpc: str) -> Call:
    return next(c for c in node.valid_calls() if c.rpc == rpc)


@pytest.mark.slow
@pytest.mark.parametrize("rpc", RPCS)
def test_each_field_at_each_edge_value_is_answered_and_survives_a_restart(
    node: Node, rpc: str
) -> None:
    for index, path, value in list(all_edits(call_named(node, rpc))):
        call = call_named(node, rpc)
        set_field(edit_targets(call)[index], path, value)
        check_call(node, call, wire(call))
    call = call_named(node, rpc)
    raw = not_utf8(call.messages[0])
    if raw is not None:
        check_call(node, call, wire(call, raw))


def check_combined_edits(node: Node, rpc: str, data: st.DataObject) -> None:
    call = call_named(node, rpc)
    for index, message in enumerate(edit_targets(call)):
        if index == 0 or data.draw(st.booleans(), label="edit the first chunk"):
            for path, value in data.draw(edits(message), label=f"edits of message {index}"):
                set_field(message, path, value)
    check_call(node, call, wire(call))


def _settings(examples: int) -> Callable[[Any], Any]:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


@pytest.mark.parametrize("rpc", RPCS)
@_settings(BUDGET)
@given(data=st.data())
def test_several_fields_at_edge_values_are_answered_and_survive_a_restart(
    node: Node, rpc: str, data: st.DataObject
) -> None:
    check_combined_edits(node, rpc, data)


@pytest.mark.slow
@pytest.mark.parametrize("rpc", RPCS)
@_settings(SLOW_BUDGET)
@given(data=st.data())
def test_several_fields_at_edge_values_are_answered_and_survive_a_restart_long(
    node: Node, rpc: str, data: st.DataObject
) -> None:
    check_combined_edits(node, rpc, data)


@pytest.mark.parametrize("rpc", [r for r in RPCS if r != "Status"])
def test_naming_another_participant_is_permission_denied_on_every_call(
    node: Node, rpc: str
) -> None:
    call = call_named(node, rpc)
    call.messages[0].participant_id = OTHER  # type: ignore[attr-defined]

    assert node.send(call, wire(call)) == grpc.StatusCode.PERMISSION_DENIED
