"""`fedrl-server`: the aggregation server's command line.

`fedrl-server [OPTIONS]` serves, exactly as `fedrl-server serve [OPTIONS]`:
the Federation and ExperienceExchange services, one option per ServerConfig
field. `fedrl-server status` prints the state database as tables (or JSON),
also while the server runs. The TLS commands join through `main.add_command`.
Every command's options come from its config dataclass (fedrl.common.config_cli).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import grpc

from fedrl.common.config_cli import (
    config_from_options,
    doc,
    print_config_option,
    refuse_options_before_a_command,
    section,
    takes_config,
)
from fedrl.common.config_file import config_to_toml, read_config_file
from fedrl.common.config_help import ConfigGroup
from fedrl.common.durable_files import write_atomically
from fedrl.common.identity import id_to_metadata
from fedrl.common.status_file import ALL_VERSIONS, status_to_json
from fedrl.common.status_table import render_status
from fedrl.common.tls import ParticipantBundle, TlsMaterialError
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.app import serve
from fedrl.server.config import SERVE, ServerConfig
from fedrl.server.experience.exchange import ExperienceConfig
from fedrl.server.experience.service import experience_service
from fedrl.server.names import DB_FILE, DEFAULT_SESSION
from fedrl.server.security.tls_commands import init_tls, issue, revoke
from fedrl.server.status.read_model import StatusView
from fedrl.server.storage.state_db import StateDB

_DEFAULTS = ServerConfig()


CONFIG_FILE = "config.toml"
"""Under the data dir: the settings of the server that last served there, as a config file."""


@dataclass(frozen=True)
class ServeConfig:
    """Serving: the server's settings and the process's log level."""

    server: ServerConfig = field(
        default_factory=ServerConfig, metadata=section("The aggregation server.")
    )
    log_level: str = field(default="INFO", metadata=doc("Python logging level.", section=SERVE))


COMMON = ("host", "port", "data_dir", "goal_episodes", "dashboard_port", "log_level")
"""The options `fedrl-server --help` shows; the rest by section (--help-section, --help-all)."""


@click.group(
    cls=ConfigGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@takes_config(ServeConfig, common=COMMON, config_file=True)
@print_config_option
@click.pass_context
def main(ctx: click.Context, /, config: ServeConfig, print_config: bool) -> None:
    """fedrl aggregation server: asynchronous federated averaging over gRPC.

    Without a command it serves with the options below, the same as
    `fedrl-server serve`, e.g. `fedrl-server --data-dir fedrl-server-data`;
    `--config server.toml` reads the settings from a file (`fedrl-server config`
    prints those of the server that last served a data dir).
    """
    if ctx.invoked_subcommand is not None:
        refuse_options_before_a_command(ctx)
        return
    run_serve(config, print_config=print_config)


@main.command("serve")
@takes_config(ServeConfig, common=COMMON, config_file=True)
@print_config_option
def serve_command(config: ServeConfig, print_config: bool) -> None:
    """Serve the Federation service until SIGTERM or Ctrl-C."""
    run_serve(config, print_config=print_config)


def run_serve(config: ServeConfig, *, print_config: bool = False) -> None:
    """Serve until SIGTERM or Ctrl-C (or print the settings); a setting the server refuses is a
    usage error. Once it listens, the data dir records the settings (CONFIG_FILE)."""
    if print_config:
        click.echo(serve_config_toml(config), nl=False)
        return
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server = config.server

    def ready(port: int) -> None:
        write_atomically(
            server.data_dir / CONFIG_FILE,
            lambda file: file.write(serve_config_toml(config).encode("utf-8")),
        )
        _announce(server, port)

    try:
        experience = ExperienceConfig(chunk_bytes=server.chunk_bytes, limits=server.limits)
        asyncio.run(
            serve(
                server,
                extra_services=[experience_service(server.data_dir, experience)],
                on_ready=ready,
                on_dashboard=_announce_dashboard,
            )
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


def _announce(config: ServerConfig, port: int) -> None:
    # One stable line on stdout: scripts and tests read the real port from it.
    click.echo(f"fedrl-server listening on {config.host}:{port} (data in {config.data_dir})")
    sys.stdout.flush()


def _announce_dashboard(url: str) -> None:
    click.echo(f"fedrl-server dashboard on {url}")
    sys.stdout.flush()


def serve_config_toml(config: ServeConfig) -> str:
    """Serving settings as a config file: `fedrl-server serve --config FILE` serves with them."""
    return config_to_toml(
        config, title="fedrl-server settings; serve with them: `fedrl-server serve --config FILE`"
    )


@dataclass(frozen=True)
class ShowServeConfig:
    """The config command: which data dir's recorded settings to print."""

    data_dir: Path = field(
        default=_DEFAULTS.data_dir, metadata=doc("The server's data directory.", path="dir")
    )


@main.command("config")
@takes_config(ShowServeConfig)
def config_command(config: ShowServeConfig) -> None:
    """Print the settings of the server that last served a data dir, as a file for --config."""
    path = config.data_dir / CONFIG_FILE
    if not path.is_file():
        raise click.ClickException(
            f"no recorded settings in {config.data_dir}: a server records them once it listens "
            "(check --data-dir)"
        )
    try:
        serve_config = config_from_options(ServeConfig, read_config_file(ServeConfig, path))
    except ValueError as exc:
        raise click.ClickException(f"{exc} (the settings recorded in {path})") from None
    click.echo(serve_config_toml(serve_config), nl=False)


@dataclass(frozen=True)
class StatusConfig:
    """The status command: which server state, and how much of it."""

    data_dir: Path = field(
        default=_DEFAULTS.data_dir, metadata=doc("The server's data directory.", path="dir")
    )
    session: str = field(default="", metadata=doc("Only this session (default: all)."))
    versions: int = field(
        default=10, metadata=doc("Newest versions to list; 0 lists every version.")
    )
    json: bool = field(
        default=False,
        metadata=doc(
            "Print the status as JSON, the form of the data dir's global_state.json; "
            "`fedrl-client plot --server FILE` draws the global model from it."
        ),
    )

    def __post_init__(self) -> None:
        if self.versions < 0:
            raise ValueError(f"versions must be >= 0 (0: every version), got {self.versions}")


@main.command("status")
@takes_config(StatusConfig)
def status_command(config: StatusConfig) -> None:
    """Print the global state from the state database (read-only; fine while serving)."""
    try:
        db = StateDB(config.data_dir / DB_FILE, read_only=True)
    except FileNotFoundError:
        raise click.ClickException(
            f"no server state in {config.data_dir}: start fedrl-server there, or pass --data-dir"
        ) from None
    try:
        reply = StatusView(db).read(
            config.session or None, config.versions or ALL_VERSIONS, int(time.time() * 1000)
        )
    finally:
        db.close()
    if config.session and not reply.sessions:
        raise click.ClickException(f"no session named {config.session!r} in {config.data_dir}")
    click.echo(status_to_json(reply) if config.json else render_status(reply))


@dataclass(frozen=True)
class RaiseGoalConfig:
    """The raise-goal command: which server, which session, the new goal, and as whom."""

    total_episodes: int = field(metadata=doc("The new total-episodes goal."))
    address: str = field(
        default=f"127.0.0.1:{_DEFAULTS.port}", metadata=doc("The server's address host:port.")
    )
    session: str = field(default=DEFAULT_SESSION, metadata=doc("The session whose goal rises."))
    bundle: Path | None = field(
        default=None,
        metadata=doc(
            "Bundle from `fedrl-server issue` to call a TLS server with (the operator's own).",
            path="file",
            exists=True,
        ),
    )


@main.command("raise-goal")
@takes_config(RaiseGoalConfig)
def raise_goal_command(config: RaiseGoalConfig) -> None:
    """Raise a running session's goal so its participants continue."""
    channel, metadata = _operator_channel(config.address, config.bundle)
    with channel:
        stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
        try:
            goal = stub.RaiseGoal(
                pb.RaiseGoalRequest(session=config.session, total_episodes=config.total_episodes),
                metadata=metadata,
                timeout=30,
            )
        except grpc.RpcError as exc:
            raise click.ClickException(f"{exc.code().name}: {exc.details()}") from None
    click.echo(f"session {config.session}: goal {goal.total_episodes}, done {goal.episodes_done}")


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
