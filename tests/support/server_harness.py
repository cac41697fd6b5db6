"""Start a real fedrl server for a test, in-process or as a subprocess, on port 0.

In-process (fast; the test can reach the domain objects)::

    with InProcessServer(server_config(tmp_path)) as server:
        stub = server.stub()
        joined = join(stub, "alice", make_spec([(4,)]))

As a subprocess (for SIGKILL and SIGTERM tests), through the product's
launcher (fedrl.server.launcher)::

    with ServerProcess(tmp_path / "data", "--buffer-size", "2") as proc:
        stub = proc.stub()
        ...
        proc.kill()          # SIGKILL, no cleanup at all
        proc.start()         # same data dir; a new port unless port= was given
        proc.stop()          # SIGTERM: the graceful path; its exit status

The client helpers below (join, seed, push, pull) speak protocol v1 with the
real chunking code, so a test reads like a participant's session. They send
the caller's id as `fedrl-participant-bin` metadata, as a real client does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
import numpy as np

from fedrl.common.chunking import DecodeLimits, TensorListAssembler, chunk_tensors
from fedrl.common.identity import id_to_metadata
from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.app import RunningServer, ServiceRegistration, run_server
from fedrl.server.config import ServerConfig
from fedrl.server.launcher import ServerProcess as LaunchedServer

T = TypeVar("T")
NamedTensors = list[tuple[str, np.ndarray]]

CHANNEL_OPTIONS = [
    # Clients of the tests send and accept what the server does, and no more.
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
    # Reconnect within a second of a restarted server, not gRPC's default
    # backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def server_config(data_dir: Path, **overrides: Any) -> ServerConfig:
    """A config for tests: port 0, data under data_dir, a short buffer timeout."""
    values: dict[str, Any] = {"port": 0, "data_dir": data_dir, "buffer_timeout_s": 0.5}
    values.update(overrides)
    return ServerConfig(**values)


def make_spec(shapes: Sequence[tuple[int, ...]], *, env_id: str = "CartPole-v1") -> tpb.ModelSpec:
    """A model spec of float32 tensors "t0", "t1", ... with the given shapes."""
    return tpb.ModelSpec(
        tensors=[
            tpb.TensorSpec(name=f"t{i}", dtype=tpb.DTYPE_FLOAT32, shape=list(shape))
            for i, shape in enumerate(shapes)
        ],
        env_id=env_id,
        observation_space=tpb.SpaceSpec(
            kind=tpb.SPACE_KIND_BOX, shape=[4], dtype=tpb.DTYPE_FLOAT32
        ),
        action_space=tpb.SpaceSpec(kind=tpb.SPACE_KIND_DISCRETE, n=2, dtype=tpb.DTYPE_INT64),
        algorithm="dqn/test-mlp",
    )


def named(spec: tpb.ModelSpec, arrays: Sequence[np.ndarray]) -> NamedTensors:
    """Pair arrays with the spec's tensor names, as float32."""
    return [
        (t.name, np.asarray(a, dtype=np.float32)) for t, a in zip(spec.tensors, arrays, strict=True)
    ]


def metadata(participant_id: str) -> list[tuple[str, bytes]]:
    """Call metadata that says who is calling (binary: ids are Unicode)."""
    return [id_to_metadata(participant_id)]


def join(
    stub: pb_grpc.FederationStub,
    participant_id: str,
    spec: tpb.ModelSpec,
    session: str = "default",
    *,
    rules: pb.GroupRules | None = None,
) -> pb.JoinReply:
    """Join, choosing `rules` of the session's rules (None: none)."""
    return stub.Join(  # type: ignore[no-any-return]
        pb.JoinRequest(
            session=session,
            participant_id=participant_id,
            spec=spec,
            spec_hash=spec_hash(spec),
            rules=rules,
        ),
        metadata=metadata(participant_id),
    )


def seed(
    stub: pb_grpc.FederationStub,
    participant_id: str,
    spec: tpb.ModelSpec,
    arrays: Sequence[np.ndarray],
    *,
    session: str = "default",
    chunk_bytes: int = 1 << 20,
) -> pb.SeedReply:
    list_header, chunks = chunk_tensors(named(spec, arrays), chunk_bytes=chunk_bytes)
    header = pb.ModelUploadHeader(
        session=session,
        participant_id=participant_id,
        spec_hash=spec_hash(spec),
        tensors=list_header,
    )
    messages = [pb.ModelUpload(header=header), *(pb.ModelUpload(chunk=c) for c in chunks)]
    return stub.SeedModel(iter(messages), metadata=metadata(participant_id))  # type: ignore[no-any-return]


def update_messages(
    participant_id: str,
    spec: tpb.ModelSpec,
    delta: Sequence[np.ndarray],
    *,
    sequence: int,
    base_version: int,
    samples: int = 100,
    episodes: int = 1,
    env_steps: int = 100,
    session: str = "default",
    dtype: int | None = None,
    metrics: pb.UpdateMetrics | None = None,
    chunk_bytes: int = 1 << 20,
) -> list[pb.UpdateChunk]:
    """The messages of one PushUpdate stream."""
    list_header, chunks = chunk_tensors(named(spec, delta), dtype=dtype, chunk_bytes=chunk_bytes)
    header = pb.UpdateHeader(
        session=session,
        participant_id=participant_id,
        sequence=sequence,
        base_version=base_version,
        env_steps=env_steps,
        episodes=episodes,
        samples=samples,
        spec_hash=spec_hash(spec),
        tensors=list_header,
    )
    if metrics is not None:
        header.metrics.CopyFrom(metrics)
    return [pb.UpdateChunk(header=header), *(pb.UpdateChunk(chunk=c) for c in chunks)]


def push(
    stub: pb_grpc.FederationStub,
    participant_id: str,
    spec: tpb.ModelSpec,
    delta: Sequence[np.ndarray],
    **fields: Any,
) -> pb.PushReply:
    """Push one update; keyword fields as in update_messages (sequence, base_version, ...)."""
    messages = update_messages(participant_id, spec, delta, **fields)
    return stub.PushUpdate(iter(messages), metadata=metadata(participant_id), timeout=60)  # type: ignore[no-any-return]


def pull(
    stub: pb_grpc.FederationStub,
    *,
    session: str = "default",
    version: int = -1,
    have_version: int = -1,
    dtype: tpb.DType = tpb.DTYPE_FLOAT32,
    codec: tpb.Codec = tpb.CODEC_ZSTD,
    participant_id: str = "",
) -> tuple[pb.ModelHeader, list[np.ndarray], list[int]]:
    """Pull a model; returns its header, the tensors and the size of every message received."""
    request = pb.PullModelRequest(
        session=session,
        participant_id=participant_id,
        version=version,
        have_version=have_version,
        dtype=dtype,
        codec=codec,
    )
    stream = stub.PullModel(request, metadata=metadata(participant_id) if participant_id else None)
    header: pb.ModelHeader | None = None
    assembler: TensorListAssembler | None = None
    sizes = []
    for message in stream:
        sizes.append(message.ByteSize())
        if message.HasField("header"):
            header = message.header
            assembler = TensorListAssembler(
                header.tensors, DecodeLimits(max_total_raw_bytes=1 << 31)
            )
        else:
            assert assembler is not None, "chunk before the model header"
            assembler.add(message.chunk)
    assert header is not None and assembler is not None, "empty PullModel stream"
    return header, [array for _, array in assembler.result()], sizes


def wait_for_version(
    stub: pb_grpc.FederationStub,
    version: int,
    *,
    session: str = "default",
    participant_id: str = "",
    timeout_s: float = 60.0,
) -> pb.VersionNotice:
    """Block until the session's newest version is at least `version`; its notice.

    Aggregation is asynchronous; WatchVersions says when a version is
    committed, so nothing polls.
    """
    notices = stub.WatchVersions(
        pb.GetVersionRequest(session=session, participant_id=participant_id),
        metadata=metadata(participant_id) if participant_id else None,
        timeout=timeout_s,
    )
    newest = -1
    try:
        for notice in notices:
            newest = notice.current_version
            if newest >= version:
                notices.cancel()
                return notice  # type: ignore[no-any-return]
    except grpc.RpcError as exc:
        raise AssertionError(
            f"session {session!r} never reached version {version} (at {newest}): {exc}"
        ) from None
    raise AssertionError(f"session {session!r} never reached version {version} (at {newest})")


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


class InProcessServer:
    """A real server on its own event loop thread in this process."""

    def __init__(
        self, config: ServerConfig, *, extra_services: Sequence[ServiceRegistration] = ()
    ) -> None:
        self.config = config
        self.extra_services = extra_services
        self.port = 0
        self.running: RunningServer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._channels: list[grpc.Channel] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> InProcessServer:
        self._thread.start()
        self.running, self.port = self.call(
            run_server(self.config, extra_services=self.extra_services)
        )
        return self

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        """Run a coroutine on the server's loop (e.g. a Federation method) and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def stub(self) -> pb_grpc.FederationStub:
        opened = channel(self.address)
        self._channels.append(opened)
        return pb_grpc.FederationStub(opened)  # type: ignore[no-untyped-call]

    def stop(self, grace_s: float = 5.0) -> None:
        """Graceful stop: buffered updates become a version, the database closes."""
        for opened in self._channels:
            opened.close()
        self._channels.clear()
        if self.running is not None:
            self.call(self.running.stop(grace_s))
            self.running = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> InProcessServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ServerProcess(LaunchedServer):
    """The launcher's server process, with stubs whose channels close when it goes away."""

    def __init__(self, data_dir: Path, *options: str, port: int = 0) -> None:
        super().__init__(data_dir, *options, port=port)
        self._channels: list[grpc.Channel] = []

    def stub(self) -> pb_grpc.FederationStub:
        opened = channel(self.address)
        self._channels.append(opened)
        return pb_grpc.FederationStub(opened)  # type: ignore[no-untyped-call]

    def _close_channels(self) -> None:
        for opened in self._channels:
            opened.close()
        self._channels.clear()

    def kill(self) -> None:
        self._close_channels()
        super().kill()

    def stop(self, grace_s: float = 60.0) -> int | None:
        self._close_channels()
        return super().stop(grace_s)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Whatever a test left running goes at once: nothing to flush for a test.
        self.kill()
