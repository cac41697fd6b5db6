"""Build, start and stop the gRPC server: its parts put together, health, reflection, shutdown.

`run_server(config)` returns a started server and its real port (port 0
picks a free one), which is how tests start one in their own process (a
server process of its own: fedrl.server.launcher). `serve(config)` is the
process entry: it runs until SIGTERM/SIGINT, then stops accepting calls,
gives in-flight ones `grace_s` to finish, folds the update buffer into a
last version and closes the database.

Every service joins the same way, as a ServiceRegistration
(transport/grpc_server.py): the federation's, the population's, and those
passed in `extra_services` (the experience exchange, which `fedrl-server
serve` always passes). This module puts the parts together: the federation,
the status read model and global_state.json above it, the population, the
services, the dashboard; it decides nothing itself.

Transport: TLS whenever `<data-dir>/tls` holds material (`fedrl-server
init-tls`), with client certificates or, with --token-auth, bearer tokens;
plaintext only on loopback or with --insecure. Every call passes the
AuthInterceptor before any handler, so no method can forget to authenticate.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fedrl.common.chunking import DecodeLimits
from fedrl.common.tls import TlsPaths
from fedrl.server.config import ServerConfig
from fedrl.server.dashboard.web import Dashboard
from fedrl.server.federation.federation import Federation
from fedrl.server.federation.service import FederationServicer
from fedrl.server.population.population import Population
from fedrl.server.population.service import PopulationServicer
from fedrl.server.security.auth import HEALTH_METHODS, AuthInterceptor, server_transport
from fedrl.server.status.global_state import GlobalStateFile
from fedrl.server.status.read_model import ServerStatus
from fedrl.server.strategy.strategy import Rule, Strategy
from fedrl.server.transport.grpc_server import (
    MalformedRequestInterceptor,
    ServiceRegistration,
    host_for_grpc,
    server_options,
)

log = logging.getLogger(__name__)


@dataclass
class RunningServer:
    """A started server; `stop()` shuts it down gracefully."""

    server: grpc.aio.Server
    federation: Federation
    status: ServerStatus
    health: health.aio.HealthServicer
    grace_s: float
    services: Sequence[ServiceRegistration] = ()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting calls, let in-flight ones finish, fold the buffer, flush state."""
        await self.health.enter_graceful_shutdown()
        # Watch streams never end on their own; closing lets them end now
        # instead of holding the whole grace period.
        self.federation.closing.set()
        await self.server.stop(self.grace_s if grace_s is None else grace_s)
        for service in self.services:
            if service.close is not None:
                await service.close()
        await self.federation.close()


async def run_server(
    config: ServerConfig,
    *,
    extra_services: Sequence[ServiceRegistration] = (),
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    strategy: Callable[[Rule], Strategy] | None = None,
) -> tuple[RunningServer, int]:
    """Recover state, start serving on config.host:config.port; return the server and real port.

    `strategy`, when given, makes each session's aggregation strategy from the
    server's rule instead of the one config.strategy names.
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
        # The status read model sits above the features; global_state.json follows it.
        status = ServerStatus(federation)
        global_state = GlobalStateFile(config.data_dir, lambda: status.read("", 0))
        await global_state.open()
        federation.observe(global_state)
        # Population sessions (population-based training) live in the same sessions.
        population = Population(config, federation)
        await population.open()
        limits = DecodeLimits(
            max_total_raw_bytes=config.max_model_bytes, max_chunk_bytes=config.chunk_bytes
        )
        services = [
            FederationServicer(
                federation,
                status=status.read,
                limits=limits,
                chunk_bytes=config.chunk_bytes,
                call_limits=config.limits,
            ).registration(),
            PopulationServicer(
                population, limits=limits, chunk_bytes=config.chunk_bytes, call_limits=config.limits
            ).registration(),
            *extra_services,
        ]
        server = grpc.aio.server(
            options=server_options(max_message_bytes=config.max_message_bytes),
            interceptors=[
                # First: a caller who is not authenticated learns nothing, not even
                # a parse error. Health checks stay open to probes without credentials.
                AuthInterceptor(transport.authenticator, exempt=HEALTH_METHODS),
                MalformedRequestInterceptor(),
                *interceptors,
            ],
        )
        for service in services:
            service.add(server)
        names = [service.name for service in services]
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for name in ["", *names]:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        address = f"{host_for_grpc(config.host)}:{config.port}"
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
        server, federation, status, health_servicer, config.grace_s, tuple(services)
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
            url = await dashboard.start(running.status.read)
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
