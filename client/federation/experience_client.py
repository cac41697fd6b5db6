"""Calls of the ExperienceExchange service, and the outbox entries they send.

A participant's batches go through the durable outbox before any send
(`queue_experience`, kind "experience"), so a crash or an outage loses
nothing and the server's exactly-once key (participant, sequence) makes a
resend harmless. `ExperienceClient.send_pending` sends them oldest first;
`ExperienceClient.pull` fetches other participants' batches after a cursor.
Errors are those of fedrl.client.federation.errors: UnavailableError (try
again later) and RejectedError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import grpc

from fedrl.client.federation.errors import RejectedError, ServerCallError, UnavailableError
from fedrl.client.federation.federation_client import Timeouts
from fedrl.client.federation.outbox import Outbox
from fedrl.client.federation.outbox_file import Entry, OutboxError
from fedrl.common.chunking import DEFAULT_CHUNK_BYTES, DecodeLimits
from fedrl.common.errors import DecodeError
from fedrl.common.experience import BatchAssembler, ExperienceBatch, batch_messages
from fedrl.common.identity import id_to_metadata, validate_participant_id
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import experience_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb

KIND = "experience"
"""The outbox kind of experience batches."""

_DEFAULT_TIMEOUTS = Timeouts()
# Past any batch a store can hold (SQLite's largest integer), so a probe pull brings none.
_PAST_EVERY_BATCH = 2**63 - 1
# One pulled batch: one block of columns, at most the server's batch bound (64 MiB) decoded.
_DEFAULT_LIMITS = DecodeLimits(max_tensors=1, max_total_raw_bytes=64 << 20)

# Statuses where sending the same batch again cannot help.
_REFUSED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        # A server without the experience service: exchange is off there.
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


# The durable outbox.


def queue_experience(
    outbox: Outbox,
    batch: ExperienceBatch,
    *,
    session: str,
    participant_id: str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Entry:
    """Write a batch to the outbox under the next experience sequence, before any send."""

    def build(sequence: int) -> list[bytes]:
        messages = batch_messages(
            batch,
            session=session,
            participant_id=participant_id,
            sequence=sequence,
            chunk_bytes=chunk_bytes,
        )
        return [message.SerializeToString() for message in messages]

    return outbox.add(KIND, build)


def experience_messages(entry: Entry) -> list[pb.ExperienceChunk]:
    """An experience entry's messages, parsed for sending."""
    if entry.kind != KIND:
        raise OutboxError(f"entry {entry.sequence} is a {entry.kind!r}, not {KIND!r}")
    messages = [pb.ExperienceChunk.FromString(m) for m in entry.messages]
    if not messages or not messages[0].HasField("header"):
        raise OutboxError(f"experience entry {entry.sequence} does not start with its header")
    return messages


# The service.


@dataclass(frozen=True)
class Pulled:
    """What one pull brought: other participants' batches and where the next pull starts."""

    batches: list[tuple[pb.ExperienceHeader, ExperienceBatch]]
    next_cursor: int

    @property
    def transitions(self) -> int:
        return sum(len(batch) for _, batch in self.batches)


class ExperienceClient:
    """Calls of the ExperienceExchange service for one participant in one session.

    The channel belongs to the caller, as for FederationClient. Errors are
    the same two kinds: UnavailableError (try again later) and RejectedError.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        participant_id: str,
        session: str,
        timeouts: Timeouts = _DEFAULT_TIMEOUTS,
        limits: DecodeLimits = _DEFAULT_LIMITS,
    ) -> None:
        # The generated gRPC module has no type stubs.
        self._stub = pb_grpc.ExperienceExchangeStub(channel)  # type: ignore[no-untyped-call]
        self.participant_id = validate_participant_id(participant_id)
        self.session = session
        self._metadata = (id_to_metadata(self.participant_id),)
        self._timeouts = timeouts
        self._limits = limits

    async def push(self, messages: Sequence[pb.ExperienceChunk]) -> pb.PushExperienceReply:
        """Send batches built by queue_experience; the reply means they are durable."""
        sequences = [m.header.sequence for m in messages if m.HasField("header")]
        what = f"push of experience {sequences}"
        try:
            reply = cast(
                pb.PushExperienceReply,
                await self._stub.PushExperience(
                    _aiter(messages), metadata=self._metadata, timeout=self._timeouts.transfer_s
                ),
            )
        except grpc.aio.AioRpcError as exc:
            if _status_lost(exc) and await self._service_missing():
                raise RejectedError(
                    f"{what}: the server has no experience service", grpc.StatusCode.UNIMPLEMENTED
                ) from None
            raise _translate(exc, what) from None
        acked = [ack.sequence for ack in reply.acks]
        if acked != sequences:
            # An ack for another sequence would delete the wrong outbox entry.
            raise RejectedError(f"{what}: the server acknowledged {acked}")
        return reply

    async def send_pending(self, outbox: Outbox) -> int:
        """Send the outbox's experience entries oldest first; returns how many were acknowledged.

        A refused entry is moved aside by the outbox (kept for a human) and
        the rest go on; an outage raises UnavailableError, a server without
        the service RejectedError (UNIMPLEMENTED), both leaving the entry queued.
        """
        sent = 0
        while (entry := outbox.next_to_send(KIND)) is not None:
            try:
                await self.push(experience_messages(entry))
            except RejectedError as exc:
                if exc.code == grpc.StatusCode.UNIMPLEMENTED:
                    # Not the batch's fault: keep it for a server that has the service.
                    raise
                outbox.reject(KIND, entry.sequence, str(exc))
                continue
            outbox.acknowledge(KIND, entry.sequence)
            sent += 1
        return sent

    async def pull(
        self, cursor: int, max_transitions: int, *, timeout_s: float | None = None
    ) -> Pulled:
        """Other participants' batches after cursor, up to max_transitions, within `timeout_s`
        (default: the transfer timeout)."""
        request = pb.PullExperienceRequest(
            session=self.session,
            participant_id=self.participant_id,
            cursor=cursor,
            max_transitions=max_transitions,
            codec=tpb.CODEC_ZSTD,
        )
        what = "pull of experience"
        try:
            call = self._stub.PullExperience(
                request,
                metadata=self._metadata,
                timeout=self._timeouts.transfer_s if timeout_s is None else timeout_s,
            )
            return await self._assemble(call)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, what) from None
        except DecodeError as exc:
            # Nothing was kept and the cursor did not move: asking again is safe.
            raise UnavailableError(f"{what}: {exc}") from None

    async def _service_missing(self) -> bool:
        """Whether the server lacks this service, asked with a pull that brings nothing.

        A pull is one request message, so its status cannot be lost the way a
        stream's can (see _status_lost). The cursor past any batch makes it cheap.
        """
        try:
            await self.pull(_PAST_EVERY_BATCH, 1, timeout_s=self._timeouts.unary_s)
        except ServerCallError as exc:
            return bool(exc.code == grpc.StatusCode.UNIMPLEMENTED)
        return False

    async def _assemble(self, call: AsyncIterator[pb.ExperienceChunk]) -> Pulled:
        batches: list[tuple[pb.ExperienceHeader, ExperienceBatch]] = []
        header: pb.ExperienceHeader | None = None
        assembler: BatchAssembler | None = None
        async for message in call:
            if message.HasField("header"):
                if assembler is not None:
                    raise DecodeError("a batch header arrived inside another batch")
                header = message.header
                assembler = BatchAssembler(header, self._limits)
            elif message.HasField("chunk"):
                if assembler is None or header is None:
                    raise DecodeError("a chunk arrived before its batch header")
                assembler.add(message.chunk)
                if assembler.complete:
                    batches.append((header, assembler.result()))
                    assembler = None
            elif message.HasField("end"):
                if assembler is not None:
                    raise DecodeError("the pull ended inside a batch")
                return Pulled(batches, message.end.next_cursor)
        raise DecodeError("the pull stream ended without its end message")


def _status_lost(exc: grpc.aio.AioRpcError) -> bool:
    """Whether gRPC's asyncio client replaced the server's status with its own INTERNAL.

    It does so now and then when the server answers a client stream before
    the client has written it all (grpc/grpc#36066): a server without the
    service answers UNIMPLEMENTED at once, and the client sees this instead.
    """
    return bool(
        exc.code() == grpc.StatusCode.INTERNAL and exc.details() == "Internal error from Core"
    )


def _translate(exc: grpc.aio.AioRpcError, what: str) -> ServerCallError:
    code = exc.code()
    message = f"{what}: {exc.details() or code.name}"
    if code in _REFUSED:
        return RejectedError(message, code)
    return UnavailableError(message, code)


async def _aiter(items: Iterable[pb.ExperienceChunk]) -> AsyncIterator[pb.ExperienceChunk]:
    for item in items:
        yield item
