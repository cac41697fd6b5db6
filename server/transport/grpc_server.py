"""What every service of the gRPC server shares: how it joins, the channel options, parse errors.

A service joins the server through a ServiceRegistration (server/app.py adds
each one the same way: its servicer, its health status, its name for
reflection, and its close at shutdown), so adding a service never changes
the server's assembly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError as ProtobufDecodeError

from fedrl.server.transport.handlers import GuardingInterceptor, guard_handler


@dataclass(frozen=True)
class ServiceRegistration:
    """A gRPC service of the server: its full name, how to add it, how to close it."""

    name: str
    """Full service name, e.g. "fedrl.v1.ExperienceExchange" (health and reflection list it)."""
    add: Callable[[grpc.aio.Server], None]
    """Adds the servicer, typically via the generated add_*_to_server."""
    close: Callable[[], Awaitable[None]] | None = None
    """Called at shutdown once no call is in flight, to flush and release what it holds."""

    @classmethod
    def of(
        cls,
        name: str,
        add_servicer: Callable[[Any, grpc.aio.Server], None],
        servicer: object,
        *,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> ServiceRegistration:
        """`servicer` as the service `name`, added by its generated add_*_to_server."""
        return cls(name=name, add=lambda server: add_servicer(servicer, server), close=close)


def server_options(*, max_message_bytes: int) -> list[tuple[str, Any]]:
    """Channel arguments of the server, each with the reason for its value."""
    return [
        # Tensors travel in chunks of at most chunk_bytes, so no legitimate
        # message comes near this; it only stops a peer's oversized message.
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # Participants hold WatchVersions streams open for hours, often behind
        # NAT; home routers drop idle TCP mappings after a few minutes, so the
        # server pings every 60 s and gives a peer 20 s to answer before it
        # closes a dead connection (and frees its stream).
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        # Clients may ping to keep their own streams alive, but not more often
        # than every 10 s: more would only cost the server, never help.
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        # A second server on the same port would silently split participants
        # between two global models; refuse to share the port instead.
        ("grpc.so_reuseport", 0),
    ]


class MalformedRequestInterceptor(GuardingInterceptor):
    """Answers INVALID_ARGUMENT, naming the parse error, for request bytes that do not parse.

    grpc-python reports a request it cannot deserialise as UNKNOWN
    ("Unexpected DecodeError"), which reads like a server bug; bytes that are
    not the method's message are the caller's error. The deserialiser is
    wrapped to hand the handler a marker instead of raising, and the marker
    is refused before the servicer sees it.
    """

    def guard(self, handler: Any, method: str) -> grpc.RpcMethodHandler:
        if handler.request_deserializer is None:
            return handler
        return _parse_guarded(handler)


@dataclass(frozen=True)
class _Malformed:
    """What the wrapped deserialiser returns for bytes that do not parse."""

    reason: str


def _parse_guarded(handler: Any) -> grpc.RpcMethodHandler:
    parse = handler.request_deserializer

    def tolerant(raw: bytes) -> Any:
        try:
            return parse(raw)
        except ProtobufDecodeError as exc:
            return _Malformed(str(exc))

    async def prepare(request: Any, context: Any, requests_stream: bool) -> Any:
        if requests_stream:
            return _parsed(request, context)
        await _refuse_malformed(request, context)
        return request

    return guard_handler(handler, prepare, request_deserializer=tolerant)


async def _refuse_malformed(request: Any, context: Any) -> None:
    if isinstance(request, _Malformed):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.reason}"
        )


async def _parsed(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for request in requests:
        await _refuse_malformed(request, context)
        yield request


def host_for_grpc(host: str) -> str:
    """IPv6 literals need brackets in a gRPC address."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
