"""The ExperienceExchange gRPC servicer: stream messages <-> domain calls, refusals -> status codes.

Nothing here decides anything a unit test of experience/exchange.py could
not reach: each handler reads its messages, assembles batches with
fedrl.common.experience, calls ExperienceExchange, and answers refusals with
their status codes (transport/call_context.py).
"""

# The generated servicer base class fixes the method names (PushExperience, ...).
# ruff: noqa: N802

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from pathlib import Path

from fedrl.common.errors import DecodeError
from fedrl.common.experience import BatchAssembler, ExperienceBatch, chunk_block
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import experience_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.experience.exchange import ExperienceConfig, ExperienceExchange
from fedrl.server.experience.store import Ack, StoredBatch
from fedrl.server.refusals import InvalidRequestError
from fedrl.server.transport.call_context import REFUSALS, Context, abort, acting_as, limits_key
from fedrl.server.transport.grpc_server import ServiceRegistration
from fedrl.server.transport.limits import CallLimits
from fedrl.server.transport.uploads import upload_bytes

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExperienceExchange"].full_name


class ExperienceServicer(pb_grpc.ExperienceExchangeServicer):
    """ExperienceExchange of protocol v1 over an ExperienceExchange domain object."""

    def __init__(self, exchange: ExperienceExchange) -> None:
        self._exchange = exchange
        self._calls = CallLimits(
            exchange.config.limits,
            max_upload_bytes=upload_bytes(exchange.decode_limits),
            what="experience push",
        )

    async def PushExperience(
        self, request_iterator: AsyncIterator[pb.ExperienceChunk], context: Context
    ) -> pb.PushExperienceReply:
        reply = pb.PushExperienceReply()
        header: pb.ExperienceHeader | None = None
        participant = ""
        assembler: BatchAssembler | None = None
        messages = self._calls.incoming(request_iterator, "experience")
        try:
            key = limits_key(context)
            with self._calls.streams.hold(key):
                async for message in messages:
                    if message.HasField("header"):
                        if assembler is not None:
                            raise InvalidRequestError(
                                f"batch {header.sequence if header else 0} ended before "
                                "its last chunk"
                            )
                        header = message.header
                        participant = acting_as(context, header.participant_id)
                        # Each batch takes a token: one call cannot carry a flood.
                        self._calls.rate.acquire(key)
                        await self._exchange.check_push(
                            header.session, participant, header.sequence
                        )
                        assembler = BatchAssembler(header, self._exchange.decode_limits)
                    elif message.HasField("chunk"):
                        if assembler is None or header is None:
                            raise InvalidRequestError("a chunk before its batch's ExperienceHeader")
                        # Decompressing and checking a block is CPU work (~20 ms for
                        # 10k trading transitions): off the event loop.
                        batch = await asyncio.to_thread(_add_chunk, assembler, message.chunk)
                        if batch is not None:
                            assembler = None
                            ack = await self._exchange.push(
                                header.session, participant, header.sequence, batch
                            )
                            reply.acks.append(_ack_message(ack))
                    else:
                        raise InvalidRequestError("a push carries headers and chunks only")
                if assembler is not None:
                    raise InvalidRequestError(
                        "the stream ended inside a batch (final chunk missing)"
                    )
                if header is None:
                    raise InvalidRequestError("empty stream: expected an ExperienceHeader first")
        except DecodeError as exc:
            if header is not None:
                await self._exchange.count_rejection(header.session, participant)
            await self._calls.drain(messages)
            await abort(context, exc)
        except REFUSALS as exc:
            await self._calls.drain(messages)
            await abort(context, exc)
        return reply

    async def PullExperience(
        self, request: pb.PullExperienceRequest, context: Context
    ) -> AsyncIterator[pb.ExperienceChunk]:
        with ExitStack() as open_stream:
            try:
                open_stream.enter_context(self._calls.streams.hold(limits_key(context)))
                participant = acting_as(context, request.participant_id)
                batches, next_cursor = await self._exchange.pull(
                    request.session,
                    participant,
                    cursor=request.cursor,
                    max_transitions=request.max_transitions,
                )
            except REFUSALS as exc:
                await abort(context, exc)
                return
            sent = 0
            for stored in batches:
                for message in self._messages(stored, request.codec):
                    yield message
                sent += stored.header.transitions
            yield pb.ExperienceChunk(
                end=pb.ExperienceEnd(next_cursor=next_cursor, transitions_sent=sent)
            )

    def _messages(self, stored: StoredBatch, codec: int) -> Iterator[pb.ExperienceChunk]:
        """The stream messages of one stored batch, in the codec the caller asked for."""
        stored = self._exchange.in_codec(stored, codec)
        yield pb.ExperienceChunk(header=stored.header)
        chunk_bytes = self._exchange.config.chunk_bytes
        for chunk in chunk_block(stored.block, stored.data, chunk_bytes=chunk_bytes):
            yield pb.ExperienceChunk(chunk=chunk)


def experience_service(data_dir: Path, config: ExperienceConfig) -> ServiceRegistration:
    """The ExperienceExchange service over the data dir's stores, closed with the server."""
    exchange = ExperienceExchange(data_dir, config)
    return ServiceRegistration.of(
        SERVICE_NAME,
        pb_grpc.add_ExperienceExchangeServicer_to_server,
        ExperienceServicer(exchange),
        close=exchange.close,
    )


def _add_chunk(assembler: BatchAssembler, chunk: tpb.TensorChunk) -> ExperienceBatch | None:
    """Feed the assembler one chunk; the decoded batch once it is complete."""
    assembler.add(chunk)
    return assembler.result() if assembler.complete else None


def _ack_message(ack: Ack) -> pb.ExperienceAck:
    return pb.ExperienceAck(
        sequence=ack.sequence, duplicate=ack.duplicate, transitions_stored=ack.transitions_stored
    )
