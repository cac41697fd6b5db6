"""Wrapping gRPC method handlers so that a check runs before the servicer.

Interceptors in grpc.aio see only the handler, not the call, so a check that
must run per call (authentication, refusing malformed requests) has to rebuild
the handler around the servicer's function. The four call shapes differ only
in whether requests and responses stream; this module writes that rebuilding
once.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

Prepare = Callable[[Any, Any, bool], Awaitable[Any]]
"""(request or request iterator, context, requests_stream) -> what the servicer receives.

It may abort the call; what it returns replaces the request (or the iterator)."""


class GuardingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc has no stubs
    """An interceptor that hands every method's handler to guard(), which may wrap it.

    Unknown methods (no handler) pass through untouched, so gRPC answers them
    UNIMPLEMENTED as it would without the interceptor.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return self.guard(handler, handler_call_details.method)

    @abstractmethod
    def guard(self, handler: Any, method: str) -> grpc.RpcMethodHandler:
        """The handler to serve `method` with: `handler` itself, or one from guard_handler."""


def guard_handler(
    handler: Any,
    prepare: Prepare,
    *,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """The same method with prepare() run on each call before the servicer's function."""
    codec = {
        "request_deserializer": request_deserializer or handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    requests_stream = bool(handler.request_streaming)
    if not handler.response_streaming:
        single = handler.stream_unary if requests_stream else handler.unary_unary

        async def one_response(request: Any, context: Any) -> Any:
            request = await prepare(request, context, requests_stream)
            return await awaited(single(request, context))

        if requests_stream:
            return grpc.stream_unary_rpc_method_handler(one_response, **codec)
        return grpc.unary_unary_rpc_method_handler(one_response, **codec)

    streaming = handler.stream_stream if requests_stream else handler.unary_stream

    async def streamed(request: Any, context: Any) -> AsyncIterator[Any]:
        request = await prepare(request, context, requests_stream)
        result = streaming(request, context)
        # A streaming handler either yields its responses or awaits context.write.
        if inspect.isasyncgen(result):
            async for response in result:
                yield response
        else:
            await awaited(result)

    if requests_stream:
        return grpc.stream_stream_rpc_method_handler(streamed, **codec)
    return grpc.unary_stream_rpc_method_handler(streamed, **codec)


async def awaited(value: Any) -> Any:
    """A handler's answer, whether it was written async (the norm) or as a plain function."""
    return await value if inspect.isawaitable(value) else value
