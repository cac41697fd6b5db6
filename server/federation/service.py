"""The Federation gRPC servicer: messages <-> domain calls, domain errors -> status codes.

Nothing here decides anything a unit test of federation/federation.py could
not reach: each handler reads its messages, decodes tensors with
fedrl.common.chunking, calls Federation, and answers refusals with their
status codes (transport/call_context.py).
"""

# The generated servicer base class fixes the method names (Join, PushUpdate, ...).
# ruff: noqa: N802

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any, TypeAlias, TypeVar

from fedrl.common.chunking import DecodeLimits, chunk_tensors
from fedrl.common.errors import DecodeError
from fedrl.common.group_rules_serde import choices_from_proto
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.federation.aggregator import NamedTensors
from fedrl.server.federation.checks import ACCEPTED_DELTA_DTYPES
from fedrl.server.federation.federation import Federation
from fedrl.server.federation.session import ModelView, PushRequest, PushResult
from fedrl.server.names import now_ms
from fedrl.server.refusals import IncompleteUploadError, InvalidRequestError, LimitExceededError
from fedrl.server.transport.call_context import (
    REFUSALS,
    Context,
    abort,
    acting_as,
    authenticated_participant,
    limits_key,
)
from fedrl.server.transport.grpc_server import ServiceRegistration
from fedrl.server.transport.limits import CallLimits, LimitsConfig
from fedrl.server.transport.request_fields import check_pull_model, check_raise_goal
from fedrl.server.transport.uploads import assemble_upload, first_message, upload_bytes

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Federation"].full_name

T = TypeVar("T")
R = TypeVar("R")

Encoded: TypeAlias = tuple[tpb.TensorListHeader, list[tpb.TensorChunk]]
StatusSource: TypeAlias = Callable[[str, int], Awaitable[pb.StatusReply]]
"""(session, max versions) -> the status reply: the status read model, above the features."""

FULL_MODEL_DTYPES = (tpb.DTYPE_FLOAT32,)
CODECS = (tpb.CODEC_NONE, tpb.CODEC_ZSTD)


class EncodedModelCache:
    """The last few encoded models, so N clients pulling one new version encode it once."""

    def __init__(self, *, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Any, ...], Encoded] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple[Any, ...]) -> Encoded | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: tuple[Any, ...], value: Encoded) -> None:
        size = value[0].total_encoded_size
        if size > self._max_bytes or key in self._entries:
            return
        self._entries[key] = value
        self._bytes += size
        while self._bytes > self._max_bytes:
            _, (header, _chunks) = self._entries.popitem(last=False)
            self._bytes -= header.total_encoded_size


class FederationServicer(pb_grpc.FederationServicer):
    """Federation service of protocol v1 over a Federation domain object."""

    def __init__(
        self,
        federation: Federation,
        *,
        status: StatusSource,
        limits: DecodeLimits,
        chunk_bytes: int,
        call_limits: LimitsConfig,
        cache_bytes: int = 64 << 20,
    ) -> None:
        self._federation = federation
        self._status = status
        self._limits = limits
        self._chunk_bytes = chunk_bytes
        self._calls = CallLimits(call_limits, max_upload_bytes=upload_bytes(limits))
        self._cache = EncodedModelCache(max_bytes=cache_bytes)
        # One encoding thread keeps the event loop free during zstd; pulls of
        # one new version share one encoding (see _encoded), so more threads
        # would only help pulls of different versions at the same moment.
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedrl-encode")
        self._encoding: dict[tuple[Any, ...], asyncio.Future[Encoded]] = {}

    async def _guard(self, context: Context, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except REFUSALS as exc:
            await abort(context, exc)

    async def Join(self, request: pb.JoinRequest, context: Context) -> pb.JoinReply:
        async def call() -> pb.JoinReply:
            pid = acting_as(context, request.participant_id)
            joined = await self._federation.join(
                request.session,
                pid,
                request.spec,
                request.spec_hash,
                mode=request.mode,
                data=(request.data_source, request.synthetic_data),
                rules=choices_from_proto(request.rules),
            )
            return pb.JoinReply(
                config=self._federation.session_config(joined.session),
                current_version=joined.current_version,
                goal=joined.goal,
                server_time_unix_ms=now_ms(),
                last_update_sequence=joined.last_update_sequence,
                last_experience_sequence=joined.last_experience_sequence,
                spec_hash=joined.spec_hash,
            )

        return await self._guard(context, call)

    async def Leave(self, request: pb.LeaveRequest, context: Context) -> pb.LeaveReply:
        async def call() -> pb.LeaveReply:
            pid = acting_as(context, request.participant_id)
            await self._federation.leave(request.session, pid)
            return pb.LeaveReply()

        return await self._guard(context, call)

    async def SeedModel(
        self, request_iterator: AsyncIterator[pb.ModelUpload], context: Context
    ) -> pb.SeedReply:
        async def handle(messages: AsyncIterator[pb.ModelUpload]) -> pb.SeedReply:
            first = await first_message(messages, "ModelUploadHeader")
            if not first.HasField("header"):
                raise InvalidRequestError("a seed stream must start with its ModelUploadHeader")
            header = first.header
            pid = acting_as(context, header.participant_id)
            tensors = await self._assemble(header.tensors, messages, "seed")
            version = await self._federation.seed(header.session, pid, header.spec_hash, tensors)
            return pb.SeedReply(version=version)

        return await self._guard(
            context,
            lambda: self._calls.upload(limits_key(context), request_iterator, "seed", handle),
        )

    async def PushUpdate(
        self, request_iterator: AsyncIterator[pb.UpdateChunk], context: Context
    ) -> pb.PushReply:
        async def handle(messages: AsyncIterator[pb.UpdateChunk]) -> pb.PushReply:
            first = await first_message(messages, "UpdateHeader")
            if not first.HasField("header"):
                raise InvalidRequestError("an update stream must start with its UpdateHeader")
            header = first.header
            # Range-checked as it is made (transport/request_fields.py), before anything is logged.
            request = _push_request(header, acting_as(context, header.participant_id))
            known = await self._federation.check_push(request)
            if known is not None:
                # A repeated push is answered from its header; the upload drains the body.
                return _push_reply(known)
            try:
                tensors = await self._assemble(header.tensors, messages, "update")
            except IncompleteUploadError:
                # Cut or cancelled on the way: no update to judge, nothing to count.
                raise
            except (DecodeError, InvalidRequestError, LimitExceededError):
                await self._federation.count_rejection(request.session, request.participant_id)
                raise
            return _push_reply(await self._federation.push(request, tensors))

        return await self._guard(
            context,
            lambda: self._calls.upload(limits_key(context), request_iterator, "update", handle),
        )

    async def _assemble(
        self,
        header: tpb.TensorListHeader,
        messages: AsyncIterator[pb.UpdateChunk] | AsyncIterator[pb.ModelUpload],
        what: str,
    ) -> NamedTensors:
        return await assemble_upload(header, messages, what, self._limits)

    async def PullModel(
        self, request: pb.PullModelRequest, context: Context
    ) -> AsyncIterator[pb.ModelChunk]:
        with ExitStack() as open_stream:
            try:
                open_stream.enter_context(self._calls.streams.hold(limits_key(context)))
                requester = (
                    acting_as(context, request.participant_id)
                    if request.participant_id
                    else authenticated_participant(context) or ""
                )
                check_pull_model(request)
                view = await self._federation.model(
                    request.session, request.version, request.have_version, requester
                )
                list_header, chunks = await self._encoded(view, request.dtype, request.codec)
            except REFUSALS as exc:
                await abort(context, exc)
                return
            yield pb.ModelChunk(
                header=pb.ModelHeader(
                    session=view.session,
                    version=view.version,
                    is_delta=view.is_delta,
                    from_version=view.from_version,
                    spec_hash=view.spec_hash,
                    tensors=list_header,
                    goal=view.goal,
                    applied_sequence=view.applied_sequence,
                )
            )
            for chunk in chunks:
                yield pb.ModelChunk(chunk=chunk)

    async def _encoded(self, view: ModelView, dtype: int, codec: int) -> Encoded:
        # Full models go as float32: a rounded full model would drift from the
        # global every sync. Deltas are small, so half precision loses little.
        allowed = ACCEPTED_DELTA_DTYPES if view.is_delta else FULL_MODEL_DTYPES
        wire_dtype = dtype if dtype in allowed else tpb.DTYPE_FLOAT32
        wire_codec = codec if codec in CODECS else tpb.CODEC_ZSTD
        key = (view.session, view.version, view.from_version, wire_dtype, wire_codec)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        # Clients pull a new version all at once: the first encodes, the rest wait for it.
        pending = self._encoding.get(key)
        if pending is None:
            encode = functools.partial(
                chunk_tensors,
                view.tensors,
                dtype=wire_dtype,
                codec=wire_codec,
                chunk_bytes=self._chunk_bytes,
            )
            pending = asyncio.get_running_loop().run_in_executor(self._encoder, encode)
            self._encoding[key] = pending
            pending.add_done_callback(lambda _: self._encoding.pop(key, None))
        encoded = await asyncio.shield(pending)
        self._cache.put(key, encoded)
        return encoded

    async def close(self) -> None:
        """Stop the encoding thread once no call is left."""
        await asyncio.to_thread(self._encoder.shutdown, wait=True)

    def registration(self) -> ServiceRegistration:
        """This servicer as a service of the server, closed with it."""
        return ServiceRegistration.of(
            SERVICE_NAME, pb_grpc.add_FederationServicer_to_server, self, close=self.close
        )

    async def Status(self, request: pb.StatusRequest, context: Context) -> pb.StatusReply:
        return await self._guard(
            context, lambda: self._status(request.session, request.max_versions)
        )

    async def GetVersion(self, request: pb.GetVersionRequest, context: Context) -> pb.VersionNotice:
        async def call() -> pb.VersionNotice:
            if request.participant_id:
                acting_as(context, request.participant_id)
            return self._federation.notice(request.session)

        return await self._guard(context, call)

    async def WatchVersions(
        self, request: pb.GetVersionRequest, context: Context
    ) -> AsyncIterator[pb.VersionNotice]:
        with ExitStack() as open_stream:
            try:
                # Watches stay open for hours: they count against the stream limit.
                open_stream.enter_context(self._calls.streams.hold(limits_key(context)))
                if request.participant_id:
                    acting_as(context, request.participant_id)
                session = self._federation.session(request.session)
            except REFUSALS as exc:
                await abort(context, exc)
                return
            closing = self._federation.closing
            sent: tuple[int, int, bool, int, int] | None = None
            while not closing.is_set():
                changed = session.changed
                notice = session.notice()
                # Not episodes_done: it moves with every push, and a pusher
                # hears it in its own acknowledgement.
                key = (
                    notice.current_version,
                    notice.goal.total_episodes,
                    notice.goal.reached,
                    notice.active_participants,
                    notice.pushing_participants,
                )
                if key != sent:
                    sent = key
                    yield notice
                await _first_of(changed, closing)

    async def RaiseGoal(self, request: pb.RaiseGoalRequest, context: Context) -> pb.GoalState:
        async def call() -> pb.GoalState:
            # The operator may raise a goal without being a participant.
            if request.participant_id:
                acting_as(context, request.participant_id)
            check_raise_goal(request)
            return await self._federation.raise_goal(request.session, request.total_episodes)

        return await self._guard(context, call)

    async def ReportRatings(self, request: pb.RatingsReport, context: Context) -> pb.RatingsReply:
        async def call() -> pb.RatingsReply:
            pid = acting_as(context, request.participant_id)
            stored = await self._federation.report_ratings(request.session, pid, request.ratings)
            return pb.RatingsReply(stored=stored)

        return await self._guard(context, call)


async def _first_of(*events: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _push_request(header: pb.UpdateHeader, participant_id: str) -> PushRequest:
    metrics = {
        name: float(getattr(header.metrics, name))
        for name in ("mean_return", "eval_return", "base_eval_return", "loss", "evaluated_version")
        if header.metrics.HasField(name)
    }
    return PushRequest(
        session=header.session,
        participant_id=participant_id,
        sequence=header.sequence,
        base_version=header.base_version,
        env_steps=header.env_steps,
        episodes=header.episodes,
        samples=header.samples,
        spec_hash=header.spec_hash,
        metrics=metrics,
    )


def _push_reply(result: PushResult) -> pb.PushReply:
    return pb.PushReply(
        sequence=result.sequence,
        duplicate=result.duplicate,
        current_version=result.current_version,
        staleness=result.staleness,
        weight=result.weight,
        goal=result.goal,
    )
