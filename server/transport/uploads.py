"""Uploads: the chunks of a tensor stream whose header was read, decoded within the limits.

The federation's PushUpdate and SeedModel and the population's Report all
upload tensors the same way: a header message, then chunks; the server
checks the declared sizes against its limits before it reads a byte of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

import numpy as np

from fedrl.common.chunking import DecodeLimits, TensorListAssembler
from fedrl.common.errors import DecodeError
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.refusals import IncompleteUploadError, InvalidRequestError, LimitExceededError

T = TypeVar("T")
NamedTensors = list[tuple[str, np.ndarray]]


def upload_bytes(limits: DecodeLimits) -> int:
    """The most bytes an upload within `limits` sends: its decoded tensors and one chunk more."""
    return limits.max_total_raw_bytes + limits.max_chunk_bytes


async def assemble_upload(
    header: tpb.TensorListHeader,
    messages: AsyncIterator[Any],
    what: str,
    limits: DecodeLimits,
) -> NamedTensors:
    """The tensors of a stream whose header was read; every later message must be a chunk."""
    lists = await assemble_uploads({"chunk": header}, messages, what, limits)
    return lists["chunk"]


async def assemble_uploads(
    headers: Mapping[str, tpb.TensorListHeader],
    messages: AsyncIterator[Any],
    what: str,
    limits: DecodeLimits,
) -> dict[str, NamedTensors]:
    """The tensor lists of a stream whose header was read, by the field their chunks come in.

    Every later message must be a chunk of one of them (a Population report
    sends its model's chunks in `chunk`, then its learner's in
    `learner_chunk`), each list within the limits on its own. Chunks are
    gathered on the event loop, bounded by the list headers the assemblers
    have already checked against the limits; decompressing and converting
    them (tens of ms for a 1M-parameter model) runs on a worker thread so
    other calls are not held up meanwhile.
    """
    for field, header in headers.items():
        _check_declared_size(header, _list_name(what, field), limits)
    assemblers = {field: TensorListAssembler(header, limits) for field, header in headers.items()}
    chunks: dict[str, list[tpb.TensorChunk]] = {field: [] for field in headers}
    received = dict.fromkeys(headers, 0)
    async for message in messages:
        present = [name for name in headers if message.HasField(name)]
        if not present:
            raise InvalidRequestError(
                f"a {what} stream holds its header, then chunks of "
                f"{' and '.join(_list_name(what, f) for f in headers)} only"
            )
        field = present[0]
        chunk = getattr(message, field)
        name = _list_name(what, field)
        if len(chunk.data) > limits.max_chunk_bytes:
            raise LimitExceededError(
                f"{name} chunk {chunk.index} carries {len(chunk.data)} bytes, "
                f"above this server's chunk limit of {limits.max_chunk_bytes} "
                "(--chunk-bytes; JoinReply.config.chunk_bytes)"
            )
        received[field] += len(chunk.data)
        if received[field] > headers[field].total_encoded_size:
            raise DecodeError(
                f"{name} stream carries more than its declared "
                f"{headers[field].total_encoded_size} encoded bytes"
            )
        chunks[field].append(chunk)
    for field in headers:
        if not chunks[field] or not chunks[field][-1].last:
            # What a cancel or a cut connection looks like from here: grpc ends
            # the request stream before it marks the call cancelled.
            raise IncompleteUploadError(
                f"the {_list_name(what, field)} stream ended before its final chunk "
                "(cut or cancelled)"
            )
    return {
        field: await asyncio.to_thread(_decode, assemblers[field], chunks[field])
        for field in headers
    }


def _list_name(what: str, field: str) -> str:
    """A list's name in messages: the stream's (`chunk`), or with its field's ("report learner")."""
    return what if field == "chunk" else f"{what} {field.removesuffix('_chunk')}"


def _check_declared_size(header: tpb.TensorListHeader, what: str, limits: DecodeLimits) -> None:
    """A declared size above a limit is refused as such, before a byte of it is read.

    The assembler would refuse it too, as malformed (INVALID_ARGUMENT);
    a size limit is RESOURCE_EXHAUSTED, naming the option that sets it.
    """
    if header.total_raw_size > limits.max_total_raw_bytes:
        raise LimitExceededError(
            f"{what} declares {header.total_raw_size} decoded bytes, above this server's "
            f"limit of {limits.max_total_raw_bytes} (--max-model-bytes)"
        )
    if header.tensor_count > limits.max_tensors:
        raise LimitExceededError(
            f"{what} declares {header.tensor_count} tensors, above this server's "
            f"limit of {limits.max_tensors}"
        )


def _decode(assembler: TensorListAssembler, chunks: list[tpb.TensorChunk]) -> NamedTensors:
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.result()


async def first_message(messages: AsyncIterator[T], expected: str) -> T:
    try:
        return await anext(messages)
    except StopAsyncIteration:
        raise InvalidRequestError(f"empty stream: expected a {expected} first") from None
