"""Who may see the dashboard, and over what: decided once, before anything listens.

On loopback the page is served in plaintext to anyone on this machine, like
a loopback gRPC server (reach it from elsewhere through `ssh -L`). Anywhere
else it is served only over TLS, with the server's certificate from
`fedrl-server init-tls`, and only to holders of a bearer token from
`fedrl-server issue --token` (revocable with `fedrl-server revoke`); there is
no flag to serve it in plaintext off loopback, because the page names every
participant and a token would travel readable. The dashboard only reads what
the Status RPC already shows any authenticated participant, so any issued
token may see it; issue one for the operator with
`fedrl-server issue --token --participant-id operator`.
"""

from __future__ import annotations

import ssl
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from fedrl.common.tls import TlsMaterialError, TlsPaths, is_loopback
from fedrl.server.security.auth import AuthError, InsecureBindError, TokenBook


@dataclass(frozen=True)
class DashboardAccess:
    """How the dashboard listens (TLS or not) and whom it lets in."""

    ssl_context: ssl.SSLContext | None
    """TLS with the server's certificate; None for plaintext (loopback only)."""
    tokens: TokenBook | None
    """Checks a viewer's bearer token; None when the page is open (loopback)."""

    @property
    def scheme(self) -> str:
        return "http" if self.ssl_context is None else "https"

    def viewer(self, token: str | None) -> str | None:
        """Who a request's token belongs to ("" on an open dashboard); None: let it not in.

        A tokens file the server cannot read lets nobody in (fail closed).
        """
        if self.tokens is None:
            return ""
        if not token:
            return None
        try:
            return self.tokens.holder(token)
        except AuthError:
            return None


def dashboard_access(host: str, data_dir: Path) -> DashboardAccess:
    """The access policy for a dashboard on `host`; InsecureBindError or TlsMaterialError when
    the host is not loopback and the server has no TLS material to serve it with."""
    if is_loopback(host):
        return DashboardAccess(ssl_context=None, tokens=None)
    paths = TlsPaths.for_data_dir(data_dir)
    if not paths.has_server_material():
        raise InsecureBindError(
            f"refusing to serve the dashboard on {host!r}, which other machines can reach, "
            f"without TLS: run `fedrl-server init-tls --data-dir {data_dir} --host NAME` and "
            "`fedrl-server issue --token --participant-id operator`, or keep --dashboard-host "
            "on 127.0.0.1 and reach it through `ssh -L`"
        )
    return DashboardAccess(ssl_context=_tls_context(paths), tokens=TokenBook(paths))


def _tls_context(paths: TlsPaths) -> ssl.SSLContext:
    """TLS 1.2 or newer with the server certificate gRPC serves (one-way: browsers rarely
    hold client certificates; the token says who is looking)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(paths.server_cert, paths.server_key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsMaterialError(f"{paths.root}: cannot load the server certificate: {exc}") from None
    return context


def is_loopback_host_header(host: str) -> bool:
    """Whether a request's Host header names this machine by a loopback name or address.

    An open (loopback) dashboard answers only such requests: a web page from
    elsewhere could otherwise point its own host name at 127.0.0.1 (DNS
    rebinding) and read the dashboard through the visitor's browser.
    """
    try:
        name = urllib.parse.urlsplit("//" + host).hostname
    except ValueError:
        return False
    return name is not None and is_loopback(name)
