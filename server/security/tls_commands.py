"""Operator commands for TLS material: `init-tls`, `issue`, `revoke` (registered on fedrl-server).

All material lives under ``<data-dir>/tls/``; every file there is written
0600 and atomically. Each command prints where its files went and what to
hand to whom.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import click

from fedrl.common.config_cli import doc, takes_config
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
from fedrl.server.security import auth

_DATA_DIR_HELP = "Server data dir; TLS material goes to <data-dir>/tls/."


def _at_least_one_day(**days: int) -> None:
    for name, value in days.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1 day, got {value}")


@dataclass(frozen=True)
class InitTlsConfig:
    """The init-tls command."""

    data_dir: Path = field(metadata=doc(_DATA_DIR_HELP, path="dir"))
    hosts: tuple[str, ...] = field(
        metadata=doc(
            "Name or IP address clients dial (repeat for several); goes into the server "
            "certificate.",
            flag="--host",
        )
    )
    days: int = field(default=SERVER_DAYS, metadata=doc("Validity of the server certificate."))
    ca_days: int = field(default=CA_DAYS, metadata=doc("Validity of a newly created session CA."))
    new_ca: bool = field(
        default=False,
        metadata=doc("Replace an existing session CA. Every bundle issued so far stops working."),
    )

    def __post_init__(self) -> None:
        _at_least_one_day(days=self.days, ca_days=self.ca_days)


@dataclass(frozen=True)
class IssueConfig:
    """The issue command."""

    data_dir: Path = field(metadata=doc(_DATA_DIR_HELP, path="dir"))
    participant_id: str = field(metadata=doc("The participant's id (any script, e.g. Макар)."))
    as_token: bool = field(
        default=False,
        metadata=doc(
            "Issue a bearer token (for token-mode servers) instead of a certificate.",
            flag="--token",
        ),
    )
    days: int = field(default=PARTICIPANT_DAYS, metadata=doc("Validity of the certificate."))
    out: Path | None = field(
        default=None,
        metadata=doc(
            "Bundle file to write [default: <data-dir>/tls/participants/<id>.pem].", path="file"
        ),
    )

    def __post_init__(self) -> None:
        # The NFC form is the id: the one certificates, files and metadata carry.
        object.__setattr__(self, "participant_id", validate_participant_id(self.participant_id))
        _at_least_one_day(days=self.days)


@dataclass(frozen=True)
class RevokeConfig:
    """The revoke command."""

    data_dir: Path = field(metadata=doc(_DATA_DIR_HELP, path="dir"))
    participant_id: str = field(
        metadata=doc("The participant whose certificates and tokens stop working.")
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "participant_id", validate_participant_id(self.participant_id))


@click.command("init-tls")
@takes_config(InitTlsConfig)
def init_tls(config: InitTlsConfig) -> None:
    """Create the session CA (unless one exists) and a server certificate for --host names.

    Running it again with other hosts keeps the CA, so bundles already handed
    out stay valid, and only replaces the server certificate.
    """
    paths = TlsPaths.for_data_dir(config.data_dir)
    hosts = config.hosts
    try:
        if paths.ca_cert.exists() and not config.new_ca:
            ca = CertifiedKey.read(paths.ca_cert, paths.ca_key)
            click.echo(f"Keeping the session CA in {paths.ca_cert}")
        else:
            ca = create_ca(f"fedrl session CA ({hosts[0]})", days=config.ca_days)
            write_private(paths.ca_key, ca.key_pem)
            write_private(paths.ca_cert, ca.cert_pem)
            click.echo(f"Created session CA:  {paths.ca_cert} (key {paths.ca_key})")
        server = issue_server_cert(ca, list(hosts), days=config.days)
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
@takes_config(IssueConfig)
def issue(config: IssueConfig) -> None:
    """Issue a participant's credentials: a bundle file (certificate, key, CA) or a token."""
    paths = TlsPaths.for_data_dir(config.data_dir)
    participant_id = config.participant_id
    if not paths.ca_cert.exists():
        raise click.ClickException(
            f"no session CA in {paths.root}: run `fedrl-server init-tls` first"
        )
    if config.as_token:
        token = auth.issue_token(paths, participant_id)
        click.echo(f"Token for {participant_id!r} (shown only now; the server keeps its hash):")
        click.echo(token)
        click.echo(f"Hand {participant_id} this token and the CA certificate {paths.ca_cert}.")
        click.echo("They connect with: fedrl-client --ca-cert ca.pem --token-file FILE")
        click.echo("Any earlier token of this participant no longer works.")
        return
    try:
        ca = CertifiedKey.read(paths.ca_cert, paths.ca_key)
        pair = issue_participant_cert(ca, participant_id, days=config.days)
    except TlsMaterialError as exc:
        raise click.ClickException(str(exc)) from None
    # Recorded before the bundle exists, so every bundle ever written is revocable.
    auth.record_issued(paths, participant_id, pair.cert_pem)
    bundle = ParticipantBundle(cert_pem=pair.cert_pem, key_pem=pair.key_pem, ca_pem=ca.cert_pem)
    target = config.out or paths.bundles / f"{safe_dirname(participant_id)}.pem"
    bundle.write(target)
    until = load_cert(pair.cert_pem).not_valid_after_utc
    click.echo(f"Bundle for {participant_id!r}: {target} (valid until {until:%Y-%m-%d})")
    click.echo(
        f"Hand this one file to {participant_id} over a private channel; it holds their key."
    )
    click.echo(f"They connect with: fedrl-client --participant-id {participant_id} --bundle FILE")


@click.command("revoke")
@takes_config(RevokeConfig)
def revoke(config: RevokeConfig) -> None:
    """Revoke every certificate and token issued to a participant, effective on its next call."""
    paths = TlsPaths.for_data_dir(config.data_dir)
    participant_id = config.participant_id
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
