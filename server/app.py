"""Build, start and stop the gRPC server: services, health, reflection, shutdown.

`run_server(config)` returns a started server and its real port (port 0
picks a free one), which is how tests start one in their own process (a
server process of its own: fedrl.server.launcher). `serve(config)` is the
process entry: it runs until SIGTERM/SIGINT, then stops accepting calls,
gives in-flight ones `grace_s` to finish, folds the update buffer into a
last version and closes the database.

Other services (the experience exchange) join through `extra_services`:
each is a ServiceRegistration, so this file does not change to add one.

Transport: TLS whenever `<data-dir>/tls` holds material (`fedrl-server
init-tls`), with client certificates or, with --token-auth, bearer tokens;
plaintext only on loopback or with --insecure. Every call passes the
AuthInterceptor before any handler, so no method can forget to authenticate.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError as ProtobufDecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fedrl.common.chunking import DecodeLimits
from fedrl.common.tls import TlsPaths
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import population_pb2_grpc
from fedrl.server.config import ServerConfig
from fedrl.server.dashboard.web import Dashboard
from fedrl.server.federation.federation import Federation
from fedrl.server.federation.service import FederationServicer
from fedrl.server.population.population import Population
from fedrl.server.population.service import SERVICE_NAME as POPULATION_SERVICE
from fedrl.server.population.service import PopulationServicer
from fedrl.server.security.auth import HEALTH_METHODS, AuthInterceptor, server_transport
from fedrl.server.strategy.aggregate import Strategy
from fedrl.server.transport.handlers import GuardingInterceptor, guard_handler

log = logging.getLogger(__name__)

FEDERATION_SERVICE = pb.DESCRIPTOR.services_by_name["Federation"].full_name


@dataclass(frozen=True)
class ServiceRegistration:
    """One more gRPC service for the server: its full name and how to add it."""

    name: str
    """Full service name, e.g. "fedrl.v1.ExperienceExchange" (health and reflection list it)."""
    add: Callable[[grpc.aio.Server], None]
    """Adds the servicer, typically via the generated add_*_to_server."""
    close: Callable[[], Awaitable[None]] | None = None
    """Called at shutdown once no call is in flight, to flush and release what it holds."""


def server_options(config: ServerConfig) -> list[tuple[str, Any]]:
    """Channel arguments of the server, each with the reason for its value."""
    return [
        # Tensors travel in chunks of at most chunk_bytes, so no legitimate
        # message comes near this; it only stops a peer's oversized message.
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
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


@dataclass
class RunningServer:
    """A started server; `stop()` shuts it down gracefully."""

    server: grpc.aio.Server
    federation: Federation
    servicer: FederationServicer
    health: health.aio.HealthServicer
    grace_s: float
    extra_services: Sequence[ServiceRegistration] = ()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting calls, let in-flight ones finish, fold the buffer, flush state."""
        await self.health.enter_graceful_shutdown()
        # Watch streams never end on their own; closing lets them end now
        # instead of holding the whole grace period.
        self.federation.closing.set()
        await self.server.stop(self.grace_s if grace_s is None else grace_s)
        for service in self.extra_services:
            if service.close is not None:
                await service.close()
        self.servicer.close()
        await self.federation.close()


async def run_server(
    config: ServerConfig,
    *,
    extra_services: Sequence[ServiceRegistration] = (),
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    strategy: Callable[[], Strategy] | None = None,
) -> tuple[RunningServer, int]:
    """Recover state, start serving on config.host:config.port; return the server and real port.

    `strategy`, when given, makes each session's aggregation strategy instead
    of the one config.strategy names.
    """
    # Decided before anything is opened: a refused address touches no state.
    transport = server_transport(
        config.host,
        TlsPaths.for_data_dir(config.data_dir),
        token_auth=config.token_auth,
        insecure=config.insecure,
    )
    federation = await Federation.open(config, strategy=strategy)
    try:
        server = grpc.aio.server(
            options=server_options(config),
            interceptors=[
                # First: a caller who is not authenticated learns nothing, not even
                # a parse error. Health checks stay open to probes without credentials.
                AuthInterceptor(transport.authenticator, exempt=HEALTH_METHODS),
                MalformedRequestInterceptor(),
                *interceptors,
            ],
        )
        limits = DecodeLimits(
            max_total_raw_bytes=config.max_model_bytes,
            max_chunk_bytes=config.chunk_bytes,
        )
        servicer = FederationServicer(
            federation, limits=limits, chunk_bytes=config.chunk_bytes, call_limits=config.limits
        )
        pb_grpc.add_FederationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        # Population sessions (population-based training) live in the same sessions.
        population = Population(config, federation)
        await population.open()
        population_pb2_grpc.add_PopulationServicer_to_server(  # type: ignore[no-untyped-call]
            PopulationServicer(
                population,
                limits=limits,
                chunk_bytes=config.chunk_bytes,
                call_limits=config.limits,
            ),
            server,
        )
        for service in extra_services:
            service.add(server)
        names = [FEDERATION_SERVICE, POPULATION_SERVICE, *(s.name for s in extra_services)]
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for name in ["", *names]:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        address = f"{_host_for_grpc(config.host)}:{config.port}"
        try:
            if transport.credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, transport.credentials)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address} (in use?): {exc}") from None
        await server.start()
    except BaseException:
        await federation.close()
        raise
    security = "plaintext" if transport.credentials is None else transport.authenticator.mode
    log.info("serving on %s:%d (%s), data in %s", config.host, port, security, config.data_dir)
    running = RunningServer(
        server, federation, servicer, health_servicer, config.grace_s, tuple(extra_services)
    )
    return running, port


async def serve(
    config: ServerConfig,
    *,
    extra_services: Sequence[ServiceRegistration] = (),
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    on_ready: Callable[[int], None] | None = None,
    on_dashboard: Callable[[str], None] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully.

    The web dashboard runs beside the services unless config.no_dashboard;
    `on_dashboard` gets its URL.
    """
    # Its access policy is decided first: a refused dashboard address opens no state.
    dashboard = None if config.no_dashboard else Dashboard.for_config(config)
    running, port = await run_server(
        config, extra_services=extra_services, interceptors=interceptors
    )
    if dashboard is not None:
        try:
            url = await dashboard.start(running.federation)
        except BaseException:
            await running.stop()
            raise
        if on_dashboard is not None:
            on_dashboard(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if on_ready is not None:
        on_ready(port)
    await stop.wait()
    log.info("shutting down: %.0f s for in-flight calls", config.grace_s)
    if dashboard is not None:
        await dashboard.stop()
    await running.stop()


def _host_for_grpc(host: str) -> str:
    """IPv6 literals need brackets in a gRPC address."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
