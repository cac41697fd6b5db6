"""Operator commands for TLS material: `init-tls`, `issue`, `revoke` (registered on fedrl-server).

All material lives under ``<data-dir>/tls/``; every file there is written
0600 and atomically. Each command prints where its files went and what to
hand to whom.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from fedrl.common.identity import safe_dirname, validate_participant_id
from fedrl.common.tls import (
    CA_DAYS,
    PARTICIPANT_DAYS,
    SERVER_DAYS,
    CertifiedKey,
    ParticipantBundle,
    TlsMaterialError,
    TlsPaths,
    create_ca,
    issue_participant_cert,
    issue_server_cert,
    load_cert,
    write_private,
)
from fedrl.server import auth

F = TypeVar("F", bound=Callable[..., Any])


def _data_dir_option(f: F) -> F:
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        required=True,
        help="Server data dir; TLS material goes to <data-dir>/tls/.",
    )(f)


def _participant_id(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    try:
        return validate_participant_id(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("init-tls")
@_data_dir_option
@click.option(
    "--host",
    "hosts",
    multiple=True,
    required=True,
    help="Name or IP address clients dial (repeat for several); goes into the server certificate.",
)
@click.option(
    "--days",
    type=click.IntRange(min=1),
    default=SERVER_DAYS,
    show_default=True,
    help="Validity of the server certificate.",
)
@click.option(
    "--ca-days",
    type=click.IntRange(min=1),
    default=CA_DAYS,
    show_default=True,
    help="Validity of a newly created session CA.",
)
@click.option(
    "--new-ca",
    is_flag=True,
    help="Replace an existing session CA. Every bundle issued so far stops working.",
)
def init_tls(data_dir: Path, hosts: tuple[str, ...], days: int, ca_days: int, new_ca: bool) -> None:
    """Create the session CA (unless one exists) and a server certificate for --host names.

    Running it again with other hosts keeps the CA, so bundles already handed
    out stay valid, and only replaces the server certificate.
    """
    paths = TlsPaths.for_data_dir(data_dir)
    try:
        if paths.ca_cert.exists() and not new_ca:
            ca = CertifiedKey.read(paths.ca_cert, paths.ca_key)
            click.echo(f"Keeping the session CA in {paths.ca_cert}")
        else:
            ca = create_ca(f"fedrl session CA ({hosts[0]})", days=ca_days)
            write_private(paths.ca_key, ca.key_pem)
            write_private(paths.ca_cert, ca.cert_pem)
            click.echo(f"Created session CA:  {paths.ca_cert} (key {paths.ca_key})")
        server = issue_server_cert(ca, list(hosts), days=days)
    except TlsMaterialError as exc:
        raise click.ClickException(str(exc)) from None
    write_private(paths.server_key, server.key_pem)
    write_private(paths.server_cert, server.cert_pem)
    until = load_cert(server.cert_pem).not_valid_after_utc
    click.echo(
        f"Server certificate:  {paths.server_cert} for {', '.join(hosts)}, until {until:%Y-%m-%d}"
    )
    click.echo(f"Keep {paths.ca_key} secret: whoever holds it can mint participants.")
    click.echo(
        "Next: `fedrl-server issue --data-dir ... --participant-id NAME` for each participant."
    )


@click.command("issue")
@_data_dir_option
@click.option(
    "--participant-id",
    required=True,
    callback=_participant_id,
    help="The participant's id (any script, e.g. Макар).",
)
@click.option(
    "--token",
    "as_token",
    is_flag=True,
    help="Issue a bearer token (for token-mode servers) instead of a certificate.",
)
@click.option(
    "--days",
    type=click.IntRange(min=1),
    default=PARTICIPANT_DAYS,
    show_default=True,
    help="Validity of the certificate.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Bundle file to write [default: <data-dir>/tls/participants/<id>.pem].",
)
def issue(data_dir: Path, participant_id: str, as_token: bool, days: int, out: Path | None) -> None:
    """Issue a participant's credentials: a bundle file (certificate, key, CA) or a token."""
    paths = TlsPaths.for_data_dir(data_dir)
    if not paths.ca_cert.exists():
        raise click.ClickException(
            f"no session CA in {paths.root}: run `fedrl-server init-tls` first"
        )
    if as_token:
        token = auth.issue_token(paths, participant_id)
        click.echo(f"Token for {participant_id!r} (shown only now; the server keeps its hash):")
        click.echo(token)
        click.echo(f"Hand {participant_id} this token and the CA certificate {paths.ca_cert}.")
        click.echo("They connect with: fedrl-client --ca-cert ca.pem --token-file FILE")
        click.echo("Any earlier token of this participant no longer works.")
        return
    try:
        ca = CertifiedKey.read(paths.ca_cert, paths.ca_key)
        pair = issue_participant_cert(ca, participant_id, days=days)
    except TlsMaterialError as exc:
        raise click.ClickException(str(exc)) from None
    # Recorded before the bundle exists, so every bundle ever written is revocable.
    auth.record_issued(paths, participant_id, pair.cert_pem)
    bundle = ParticipantBundle(cert_pem=pair.cert_pem, key_pem=pair.key_pem, ca_pem=ca.cert_pem)
    target = out or paths.bundles / f"{safe_dirname(participant_id)}.pem"
    bundle.write(target)
    until = load_cert(pair.cert_pem).not_valid_after_utc
    click.echo(f"Bundle for {participant_id!r}: {target} (valid until {until:%Y-%m-%d})")
    click.echo(
        f"Hand this one file to {participant_id} over a private channel; it holds their key."
    )
    click.echo(f"They connect with: fedrl-client --participant-id {participant_id} --bundle FILE")


@click.command("revoke")
@_data_dir_option
@click.option(
    "--participant-id",
    required=True,
    callback=_participant_id,
    help="The participant whose certificates and tokens stop working.",
)
def revoke(data_dir: Path, participant_id: str) -> None:
    """Revoke every certificate and token issued to a participant, effective on its next call."""
    paths = TlsPaths.for_data_dir(data_dir)
    try:
        done = auth.revoke(paths, participant_id)
    except TlsMaterialError as exc:
        raise click.ClickException(str(exc)) from None
    # A bundle waiting to be handed over is useless now; handing it over by mistake confuses.
    waiting = paths.bundles / f"{safe_dirname(participant_id)}.pem"
    if done.serials and waiting.exists():
        waiting.unlink()
        click.echo(f"Deleted the undelivered bundle {waiting}")
    if not done.serials and not done.tokens:
        raise click.ClickException(
            f"nothing to revoke: {participant_id!r} holds no unrevoked certificate or token"
        )
    click.echo(
        f"Revoked {participant_id!r}: {len(done.serials)} certificate(s), {done.tokens} token(s). "
        "A running server refuses them from the next call; `issue` again to let them back in."
    )
