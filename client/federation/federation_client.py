"""A thin asyncio client of the Federation service, speaking as one participant.

Every call carries the participant id as binary metadata (plain gRPC metadata
is ASCII-only and ids are Unicode) and a deadline, so a dead server costs a
bounded wait; the one exception is `watch_versions`, a stream that stays open
for hours. gRPC status codes become the two kinds of error of
fedrl.client.federation.errors:

- `UnavailableError` (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED from
  a rate or stream limit, a cut call: CANCELLED, and a server fault: INTERNAL,
  UNKNOWN, ABORTED): try the same request again later, with backoff. A server
  fault is retried, not dropped: the request may be fine and the server
  restarted, and the outbox must never lose an update. A model stream that
  fails its checks is UnavailableError too: nothing was adopted, so asking
  again is safe.
- `RejectedError` (INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED,
  FAILED_PRECONDITION, NOT_FOUND, RESOURCE_EXHAUSTED from a size limit, ...):
  sending it again cannot help; `code` and the server's message say why.
  `SpecMismatchError` is FAILED_PRECONDITION at Join (the local model, mode or
  rules do not fit the session); `AlreadySeededError` is ALREADY_EXISTS at SeedModel (pull
  the other participant's seed instead).

Updates are built as messages by `build_update` and sent by `push_update`, so
the outbox can store the exact bytes that go on the wire and resend them
unchanged after a crash.
"""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
import numpy as np

from fedrl.client.federation.errors import (
    AlreadySeededError,
    RejectedError,
    ServerCallError,
    SpecMismatchError,
    UnavailableError,
)
from fedrl.common.chunking import (
    DEFAULT_CHUNK_BYTES,
    DecodeLimits,
    NamedTensors,
    TensorListAssembler,
    chunk_tensors,
)
from fedrl.common.errors import DecodeError
from fedrl.common.identity import id_to_metadata, validate_participant_id
from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb

T = TypeVar("T")
M = TypeVar("M")
R = TypeVar("R")

_DEFAULT_LIMITS = DecodeLimits()

# Statuses where the same request may succeed later: the server is down,
# slow, throttling us, or failed in a way a restart may cure.
_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    }
)


# RESOURCE_EXHAUSTED means "slow down" when a rate or stream limit answered
# (fedrl.server.transport.limits words its messages so), but "never" when a size limit
# did: resending an oversized update would be refused forever.
_THROTTLED = ("rate limit", "stream limit")


def _translate(exc: grpc.aio.AioRpcError, what: str) -> ServerCallError:
    code = exc.code()
    details = exc.details() or code.name
    message = f"{what}: {details}"
    throttled = code == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
        phrase in details for phrase in _THROTTLED
    )
    if code in _RETRYABLE or throttled:
        return UnavailableError(message, code)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return AlreadySeededError(message, code)
    return RejectedError(message, code)


@dataclass(frozen=True)
class DataLabel:
    """What a participant trains on (a trading run's market), as status shows it."""

    source: str
    synthetic: bool


@dataclass(frozen=True)
class Timeouts:
    """Deadlines of Federation calls, in seconds."""

    unary_s: float = 15.0
    """Join, Status, GetVersion, RaiseGoal, Leave: small messages, a few database rows."""
    transfer_s: float = 300.0
    """SeedModel, PushUpdate, PullModel: whole models over a home uplink."""


@dataclass(frozen=True)
class GlobalModel:
    """A global version as the client holds it: full float32 tensors."""

    version: int
    tensors: NamedTensors
    goal: pb.GoalState
    applied_sequence: int = 0
    """This participant's highest update sequence the version includes (0: none)."""


def build_update(
    *,
    session: str,
    participant_id: str,
    sequence: int,
    base_version: int,
    env_steps: int,
    episodes: int,
    samples: int,
    metrics: pb.UpdateMetrics,
    spec_hash: str,
    delta: Sequence[tuple[str, np.ndarray]],
    dtype: int = tpb.DTYPE_BFLOAT16,
    codec: int = tpb.CODEC_ZSTD,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> list[pb.UpdateChunk]:
    """The exact messages of one PushUpdate stream: the header, then the delta's chunks.

    bfloat16 is the default wire type: it keeps float32's exponent range, so a
    delta of any scale survives, and zstd then halves it again.
    """
    tensors, chunks = chunk_tensors(delta, dtype=dtype, codec=codec, chunk_bytes=chunk_bytes)
    header = pb.UpdateHeader(
        session=session,
        participant_id=participant_id,
        sequence=sequence,
        base_version=base_version,
        env_steps=env_steps,
        episodes=episodes,
        samples=samples,
        metrics=metrics,
        spec_hash=spec_hash,
        tensors=tensors,
    )
    return [pb.UpdateChunk(header=header), *(pb.UpdateChunk(chunk=c) for c in chunks)]


class FederationClient:
    """Calls of the Federation service for one participant in one session.

    The channel belongs to the caller (plaintext for loopback tests, TLS from
    fedrl.client.federation.channel.open_channel otherwise), who also closes it.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        participant_id: str,
        session: str,
        timeouts: Timeouts = Timeouts(),
        limits: DecodeLimits = _DEFAULT_LIMITS,
    ) -> None:
        # The generated gRPC module has no type stubs.
        self._stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
        self.participant_id = validate_participant_id(participant_id)
        self.session = session
        self._metadata = (id_to_metadata(self.participant_id),)
        self._timeouts = timeouts
        self._limits = limits
        self._spec_hash = ""
        self.config = pb.SessionConfig()
        """The server's session settings, known after join()."""

    @property
    def spec_hash(self) -> str:
        """The session's spec hash, known after join()."""
        return self._spec_hash

    @property
    def chunk_bytes(self) -> int:
        """Chunk size to send: the server's, or the protocol default before join()."""
        return self.config.chunk_bytes or DEFAULT_CHUNK_BYTES

    async def join(
        self,
        spec: tpb.ModelSpec,
        *,
        client_version: str = "",
        mode: str = "",
        rules: pb.GroupRules | None = None,
        data: DataLabel | None = None,
    ) -> pb.JoinReply:
        """Enter the session; SpecMismatchError when the local model (or `mode`, or `rules`)
        does not fit it.

        `mode` "pbt" joins (or creates) a population session instead of an averaging one.
        `rules`: the session's rules this participant chose (they fix a new session's; an
        existing session refuses them where its own differ). `data` says what the
        participant trains on, for status and the dashboard.
        """
        digest = spec_hash(spec)
        request = pb.JoinRequest(
            session=self.session,
            participant_id=self.participant_id,
            spec=spec,
            spec_hash=digest,
            client_version=client_version,
            mode=mode,
            rules=rules,
            data_source=data.source if data is not None else "",
            synthetic_data=data.synthetic if data is not None else False,
        )
        try:
            reply: pb.JoinReply = await self._unary(self._stub.Join, request, "join")
        except RejectedError as exc:
            if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
                raise SpecMismatchError(str(exc), exc.code) from None
            raise
        self.config = reply.config
        self._spec_hash = reply.spec_hash or digest
        return reply

    async def leave(self, reason: str = "") -> None:
        request = pb.LeaveRequest(
            session=self.session, participant_id=self.participant_id, reason=reason
        )
        await self._unary(self._stub.Leave, request, "leave")

    async def seed_model(self, tensors: Sequence[tuple[str, np.ndarray]]) -> int:
        """Upload version 0 of an empty session (float32: every later delta builds on it)."""
        self._require_join("seed")
        list_header, chunks = chunk_tensors(
            tensors, dtype=tpb.DTYPE_FLOAT32, chunk_bytes=self.chunk_bytes
        )
        header = pb.ModelUploadHeader(
            session=self.session,
            participant_id=self.participant_id,
            spec_hash=self._spec_hash,
            tensors=list_header,
        )
        messages = [pb.ModelUpload(header=header), *(pb.ModelUpload(chunk=c) for c in chunks)]
        reply: pb.SeedReply = await self._stream_unary(self._stub.SeedModel, messages, "seed")
        return reply.version

    async def push_update(self, messages: Sequence[pb.UpdateChunk]) -> pb.PushReply:
        """Send one update built by build_update; the reply means it is durable on the server."""
        if not messages or not messages[0].HasField("header"):
            raise ValueError("an update stream starts with its UpdateHeader")
        sequence = messages[0].header.sequence
        reply: pb.PushReply = await self._stream_unary(
            self._stub.PushUpdate, messages, f"push of update {sequence}"
        )
        if reply.sequence != sequence:
            # An ack for another sequence would make the outbox delete the
            # wrong file; refuse it loudly rather than lose an update.
            raise RejectedError(
                f"push of update {sequence}: the server acknowledged sequence {reply.sequence}"
            )
        return reply

    async def pull_model(
        self,
        *,
        version: int = -1,
        have: GlobalModel | None = None,
        dtype: int = tpb.DTYPE_FLOAT32,
        codec: int = tpb.CODEC_ZSTD,
    ) -> GlobalModel:
        """A global version (-1: the newest), as full tensors.

        With `have`, the server may send the difference from that version,
        which is added onto it here. Float32 is the default even for deltas:
        a rounded delta would make the local copy drift from the global.
        No join is needed: watching a session's model (`fedrl-client record`)
        is not taking part in it.
        """
        request = pb.PullModelRequest(
            session=self.session,
            participant_id=self.participant_id,
            version=version,
            have_version=have.version if have is not None else -1,
            dtype=cast(tpb.DType, dtype),
            codec=cast(tpb.Codec, codec),
        )
        what = "pull of the global model"
        call = self._stub.PullModel(
            request, metadata=self._metadata, timeout=self._timeouts.transfer_s
        )
        header, tensors = await self._receive_model(call, what)
        try:
            if header.is_delta:
                tensors = _apply_delta(header, tensors, have)
        except DecodeError as exc:
            raise UnavailableError(f"{what}: {exc}") from None
        return GlobalModel(
            version=header.version,
            tensors=tensors,
            goal=header.goal,
            applied_sequence=header.applied_sequence,
        )

    async def status(self, *, max_versions: int = 0, all_sessions: bool = False) -> pb.StatusReply:
        request = pb.StatusRequest(
            session="" if all_sessions else self.session, max_versions=max_versions
        )
        reply: pb.StatusReply = await self._unary(self._stub.Status, request, "status")
        return reply

    async def get_version(self) -> pb.VersionNotice:
        request = pb.GetVersionRequest(session=self.session, participant_id=self.participant_id)
        reply: pb.VersionNotice = await self._unary(self._stub.GetVersion, request, "get version")
        return reply

    async def watch_versions(self) -> AsyncGenerator[pb.VersionNotice]:
        """The session's notices: one now, then one whenever its version, goal or members change.

        Without a deadline: the stream is meant to stay open for hours. It
        ends with UnavailableError when the connection breaks (a server that
        vanished without closing it is found by the channel's keepalive pings,
        see channel.open_channel) and ends quietly when the server closes it
        at shutdown. Use it inside `contextlib.aclosing` so that leaving the
        loop early cancels the call at once.
        """
        request = pb.GetVersionRequest(session=self.session, participant_id=self.participant_id)
        call = self._stub.WatchVersions(request, metadata=self._metadata)
        try:
            async for notice in call:
                yield notice
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, "watch of versions") from None
        finally:
            call.cancel()

    async def raise_goal(self, total_episodes: int) -> pb.GoalState:
        """Raise the session's total-episodes goal (a lower number is RejectedError)."""
        request = pb.RaiseGoalRequest(
            session=self.session,
            participant_id=self.participant_id,
            total_episodes=total_episodes,
        )
        reply: pb.GoalState = await self._unary(self._stub.RaiseGoal, request, "raise goal")
        return reply

    async def report_ratings(self, ratings: Sequence[pb.PlayerRating]) -> int:
        """Two-player games: this participant's newest ratings (ReportRatings); how many the
        server stored."""
        request = pb.RatingsReport(
            session=self.session, participant_id=self.participant_id, ratings=list(ratings)
        )
        reply: pb.RatingsReply = await self._unary(
            self._stub.ReportRatings, request, "report ratings"
        )
        return int(reply.stored)

    # Internals.

    def _require_join(self, what: str) -> None:
        if not self._spec_hash:
            raise RuntimeError(f"{what} before join(): the session's spec hash is not known yet")

    async def _unary(self, method: Callable[..., Any], request: Any, what: str) -> Any:
        try:
            return await method(request, metadata=self._metadata, timeout=self._timeouts.unary_s)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, what) from None

    async def _stream_unary(
        self, method: Callable[..., Any], messages: Iterable[Any], what: str
    ) -> Any:
        try:
            return await method(
                _aiter(messages), metadata=self._metadata, timeout=self._timeouts.transfer_s
            )
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, what) from None

    async def _receive_model(
        self, call: AsyncIterator[pb.ModelChunk], what: str
    ) -> tuple[pb.ModelHeader, NamedTensors]:
        """A model stream's header and tensors, its failures as this module's errors."""
        return await self._receive(call, what, self._assemble_model)

    async def _receive(
        self,
        call: AsyncIterator[M],
        what: str,
        assemble: Callable[[AsyncIterator[M]], Awaitable[R]],
    ) -> R:
        """What `assemble` makes of a server stream, its failures as this module's errors."""
        try:
            return await assemble(call)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, what) from None
        except DecodeError as exc:
            # A corrupt stream may be a cut connection as well as a bad server:
            # nothing was adopted, so asking again is safe.
            raise UnavailableError(f"{what}: {exc}") from None

    async def _assemble_model(
        self, call: AsyncIterator[pb.ModelChunk]
    ) -> tuple[pb.ModelHeader, NamedTensors]:
        header: pb.ModelHeader | None = None
        assembler: TensorListAssembler | None = None
        async for message in call:
            if header is None:
                if not message.HasField("header"):
                    raise DecodeError("model stream does not start with its ModelHeader")
                header = message.header
                # A client that joined takes only its session's model; one that only
                # watches (no join) takes the session's, whatever its spec.
                if self._spec_hash and header.spec_hash != self._spec_hash:
                    raise DecodeError(
                        f"model of spec {header.spec_hash[:12]} in a session of spec "
                        f"{self._spec_hash[:12]}"
                    )
                assembler = TensorListAssembler(header.tensors, self._limits)
            elif assembler is None or not message.HasField("chunk"):
                raise DecodeError("a second header inside the model stream")
            else:
                assembler.add(message.chunk)
        if header is None or assembler is None:
            raise DecodeError("empty model stream")
        return header, assembler.result()


def _apply_delta(
    header: pb.ModelHeader, delta: NamedTensors, have: GlobalModel | None
) -> NamedTensors:
    if have is None or header.from_version != have.version:
        held = "none" if have is None else str(have.version)
        raise DecodeError(
            f"server sent a delta from version {header.from_version}; the client holds {held}"
        )
    if [name for name, _ in delta] != [name for name, _ in have.tensors]:
        raise DecodeError("delta tensors do not match the held model's names")
    full: NamedTensors = []
    for (name, change), (_, base) in zip(delta, have.tensors, strict=True):
        if change.shape != base.shape:
            raise DecodeError(
                f"delta tensor {name!r} has shape {list(change.shape)}, "
                f"the held model {list(base.shape)}"
            )
        full.append((name, (base.astype(np.float32) + change).astype(np.float32)))
    return full


async def _aiter(items: Iterable[T]) -> AsyncIterator[T]:
    for item in items:
        yield item
