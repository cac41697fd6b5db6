"""`fedrl-server`: the aggregation server's command line.

`fedrl-server` alone serves with the defaults. `fedrl-server serve` runs the
Federation and ExperienceExchange services and takes one option per
ServerConfig field, generated from the dataclass so the two never drift.
`fedrl-server status` prints the state database as tables, also while the
server runs. The TLS commands join through `main.add_command`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import grpc

from fedrl.common.identity import id_to_metadata
from fedrl.common.tls import ParticipantBundle, TlsMaterialError
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.app import ServiceRegistration, serve
from fedrl.server.config import ServerConfig
from fedrl.server.experience_service import ExperienceConfig, experience_service
from fedrl.server.session import DB_FILE, DEFAULT_SESSION
from fedrl.server.state_db import StateDB
from fedrl.server.status_table import render_status
from fedrl.server.tls_commands import init_tls, issue, revoke

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULTS = ServerConfig()
_CLICK_TYPES: dict[Any, Any] = {
    "int": int,
    "float": float,
    "str": str,
    "Path": click.Path(path_type=Path, file_okay=False),
}


def option_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def config_options(command: F) -> F:
    """One click option per ServerConfig field, with its default and help.

    A bool field is a flag (`--insecure`), a tuple field a repeatable option
    (`--session-strategy`, once per session).
    """
    for item in reversed(dataclasses.fields(ServerConfig)):
        kind: dict[str, Any]
        if item.type == "bool":
            kind = {"is_flag": True}
        elif item.type == "tuple[str, ...]":
            kind = {"type": str, "multiple": True}
        else:
            kind = {"type": _CLICK_TYPES[item.type]}
        decorator = click.option(
            option_name(item.name),
            item.name,
            default=getattr(_DEFAULTS, item.name),
            show_default=True,
            help=item.metadata["help"],
            **kind,
        )
        command = decorator(command)
    return command


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def main(ctx: click.Context) -> None:
    """fedrl aggregation server: asynchronous federated averaging over gRPC.

    Without a command, serves with the defaults (same as `fedrl-server serve`).
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(serve_command, **dataclasses.asdict(_DEFAULTS))


@main.command("serve")
@config_options
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
def serve_command(log_level: str = "INFO", **options: Any) -> None:
    """Serve the Federation service until SIGTERM or Ctrl-C."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = ServerConfig(**options)
        services = [experience_registration(config)]
        asyncio.run(
            serve(
                config,
                extra_services=services,
                on_ready=lambda port: _announce(config, port),
                on_dashboard=_announce_dashboard,
            )
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


def experience_registration(config: ServerConfig) -> ServiceRegistration:
    """The ExperienceExchange service beside Federation, closed with the server."""
    registration, exchange = experience_service(
        config.data_dir, ExperienceConfig(chunk_bytes=config.chunk_bytes)
    )
    return dataclasses.replace(registration, close=exchange.close)


def _announce(config: ServerConfig, port: int) -> None:
    # One stable line on stdout: scripts and tests read the real port from it.
    click.echo(f"fedrl-server listening on {config.host}:{port} (data in {config.data_dir})")
    sys.stdout.flush()


def _announce_dashboard(url: str) -> None:
    click.echo(f"fedrl-server dashboard on {url}")
    sys.stdout.flush()


@main.command("status")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=_DEFAULTS.data_dir,
    show_default=True,
    help="The server's data directory.",
)
@click.option("--session", default="", help="Only this session (default: all).")
@click.option("--versions", default=10, show_default=True, help="Newest versions to list.")
def status_command(data_dir: Path, session: str, versions: int) -> None:
    """Print the global state from the state database (read-only; fine while serving)."""
    try:
        db = StateDB(data_dir / DB_FILE, read_only=True)
    except FileNotFoundError:
        raise click.ClickException(
            f"no server state in {data_dir}: start fedrl-server there, or pass --data-dir"
        ) from None
    try:
        reply = db.status(session or None, versions, int(time.time() * 1000))
    finally:
        db.close()
    if session and not reply.sessions:
        raise click.ClickException(f"no session named {session!r} in {data_dir}")
    click.echo(render_status(reply))


@main.command("raise-goal")
@click.option("--address", default=f"127.0.0.1:{_DEFAULTS.port}", show_default=True)
@click.option("--session", default=DEFAULT_SESSION, show_default=True)
@click.option("--total-episodes", type=int, required=True, help="The new total-episodes goal.")
@click.option(
    "--bundle",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Bundle from `fedrl-server issue` to call a TLS server with (the operator's own).",
)
def raise_goal_command(
    address: str, session: str, total_episodes: int, bundle: Path | None
) -> None:
    """Raise a running session's goal so its participants continue."""
    channel, metadata = _operator_channel(address, bundle)
    with channel:
        stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
        try:
            goal = stub.RaiseGoal(
                pb.RaiseGoalRequest(session=session, total_episodes=total_episodes),
                metadata=metadata,
                timeout=30,
            )
        except grpc.RpcError as exc:
            raise click.ClickException(f"{exc.code().name}: {exc.details()}") from None
    click.echo(f"session {session}: goal {goal.total_episodes}, done {goal.episodes_done}")


def _operator_channel(
    address: str, bundle_path: Path | None
) -> tuple[grpc.Channel, list[tuple[str, bytes]]]:
    """A channel for operator calls and the metadata naming the caller.

    A TLS server authenticates every call, the operator's too: with a bundle
    the call goes over mutual TLS as the bundle's participant.
    """
    if bundle_path is None:
        return grpc.insecure_channel(address), []
    try:
        bundle = ParticipantBundle.read(bundle_path)
    except TlsMaterialError as exc:
        raise click.ClickException(str(exc)) from None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=bundle.ca_pem,
        private_key=bundle.key_pem,
        certificate_chain=bundle.cert_pem,
    )
    return grpc.secure_channel(address, credentials), [id_to_metadata(bundle.participant_id)]


# TLS material for participants (the security issue's commands).
for _command in (init_tls, issue, revoke):
    main.add_command(_command)
