"""Build, start and stop the gRPC server: services, health, reflection, shutdown.

`run_server(config)` returns a started server and its real port (port 0
picks a free one), which is how tests and benchmarks start it. `serve(config)`
is the process entry: it runs until SIGTERM/SIGINT, then stops accepting
calls, gives in-flight ones `grace_s` to finish, folds the update buffer into a
last version and closes the database.

Other services (experience exchange, later) join through `extra_services`:
each is a ServiceRegistration, so this file does not change to add one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fedrl.common.chunking import DecodeLimits
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.aggregation import Strategy
from fedrl.server.config import ServerConfig, is_loopback
from fedrl.server.service import FederationServicer
from fedrl.server.session import Federation

log = logging.getLogger(__name__)

FEDERATION_SERVICE = pb.DESCRIPTOR.services_by_name["Federation"].full_name


class InsecureAddressError(ValueError):
    """Plaintext gRPC on an address other machines can reach."""


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


def check_bind(host: str) -> None:
    """Refuse plaintext on a reachable address: ids and weights would cross in clear."""
    if not is_loopback(host):
        raise InsecureAddressError(
            f"refusing to serve plaintext gRPC on {host}: other machines could read and forge "
            "updates. Bind 127.0.0.1 (e.g. behind an SSH tunnel) until TLS is configured."
        )


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
    check_bind(config.host)
    federation = await Federation.open(config, strategy=strategy)
    try:
        server = grpc.aio.server(options=server_options(config), interceptors=list(interceptors))
        limits = DecodeLimits(
            max_total_raw_bytes=config.max_model_bytes,
            max_chunk_bytes=config.chunk_bytes,
        )
        servicer = FederationServicer(federation, limits=limits, chunk_bytes=config.chunk_bytes)
        pb_grpc.add_FederationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        for service in extra_services:
            service.add(server)
        names = [FEDERATION_SERVICE, *(s.name for s in extra_services)]
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for name in ["", *names]:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        address = f"{_host_for_grpc(config.host)}:{config.port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address} (in use?): {exc}") from None
        await server.start()
    except BaseException:
        await federation.close()
        raise
    log.info("serving on %s:%d, data in %s", config.host, port, config.data_dir)
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
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    running, port = await run_server(
        config, extra_services=extra_services, interceptors=interceptors
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if on_ready is not None:
        on_ready(port)
    await stop.wait()
    log.info("shutting down: %.0f s for in-flight calls", config.grace_s)
    await running.stop()


def _host_for_grpc(host: str) -> str:
    """IPv6 literals need brackets in a gRPC address."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
