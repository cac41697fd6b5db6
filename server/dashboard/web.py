"""The dashboard's web server: an aiohttp application on the gRPC server's own asyncio loop.

aiohttp, because its AppRunner and TCPSite start and stop as coroutines on
a loop someone else runs (here grpc.aio's): the page reads the status read
model (status/read_model.py) directly, in the same thread as every RPC, with
no second thread, process or copy of the state. It is well kept (aio-libs, releases every few
weeks) and serves TLS from a standard ssl.SSLContext. ASGI servers such as
uvicorn expect to own the loop and the signals.

Routes:
  GET  /              the page: static HTML; every figure arrives through the API
  GET  /static/NAME   its script and style sheet (package data, no build step, no CDN)
  GET  /api/status    the sessions as JSON (status_json), polled by the page
  GET  /login         where a token is required: the form to give it
  POST /login         checks the token and keeps it in an HttpOnly, Secure cookie

Every response forbids inline script, framing and content sniffing (the
Content-Security-Policy below): the page puts ids on screen as text only,
and this is the second line of defence if that ever slipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.config import ServerConfig
from fedrl.server.dashboard.access import (
    DashboardAccess,
    dashboard_access,
    is_loopback_host_header,
)
from fedrl.server.dashboard.status_json import status_document

log = logging.getLogger(__name__)

COOKIE = "fedrl_dashboard_token"
STATUS_MAX_AGE_S = 1.0
"""Viewers share one status read per second: each costs the state database a query that
acks would otherwise wait behind, and the page polls every 2 s."""
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_STATIC = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "icon.svg": "image/svg+xml",
}
_PAGES = ("index.html", "login.html")
REFUSED = '<p class="refused">That token is unknown or has been revoked.</p>'
_OPEN_PATHS = frozenset({"/login", "/static/dashboard.css", "/static/icon.svg"})
"""What a viewer without a token may fetch: the form and how it looks."""


StatusReader = Callable[[str, int], Awaitable[pb.StatusReply]]
"""(session, max versions) -> the status reply, as the Status RPC answers it."""


class StatusSource:
    """The status document, read from the status read model at most once per `max_age_s`.

    Concurrent requests wait for the same read instead of starting their own.
    """

    def __init__(
        self,
        read: StatusReader,
        *,
        max_versions: int,
        max_age_s: float = STATUS_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_status = read
        self._max_versions = max_versions
        self._max_age_s = max_age_s
        self._clock = clock
        self._latest: tuple[float, bytes] | None = None
        self._reading: asyncio.Task[bytes] | None = None

    async def document(self) -> bytes:
        """The status as UTF-8 JSON, at most `max_age_s` old."""
        if self._latest is not None and self._clock() - self._latest[0] < self._max_age_s:
            return self._latest[1]
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read())
            self._reading.add_done_callback(lambda _: setattr(self, "_reading", None))
        return await asyncio.shield(self._reading)

    async def _read(self) -> bytes:
        started = self._clock()
        reply = await self._read_status("", self._max_versions)
        body = json.dumps(status_document(reply), ensure_ascii=False, allow_nan=False)
        self._latest = (started, body.encode("utf-8"))
        return self._latest[1]


@dataclass
class Dashboard:
    """The web dashboard of one server: built from its config, started on its loop."""

    host: str
    port: int
    access: DashboardAccess
    max_versions: int
    _runner: web.AppRunner | None = field(default=None, init=False)

    @classmethod
    def for_config(cls, config: ServerConfig) -> Dashboard:
        """Decides the access policy now: InsecureBindError (plaintext off loopback) or
        TlsMaterialError before anything listens."""
        return cls(
            host=config.dashboard_host,
            port=config.dashboard_listen_port,
            access=dashboard_access(config.dashboard_host, config.data_dir),
            max_versions=config.dashboard_versions,
        )

    async def start(self, read: StatusReader) -> str:
        """Listen, showing what `read` returns; the page's URL (with the real port when 0)."""
        app = build_app(self.access, StatusSource(read, max_versions=self.max_versions))
        # Requests are short polls: a second is plenty for the last ones at shutdown.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(
            runner, self.host, self.port, ssl_context=self.access.ssl_context, reuse_port=False
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OSError(
                f"cannot serve the dashboard on {self.host}:{self.port} ({exc.strerror or exc}): "
                "pass another --dashboard-port (0 for any free one) or --no-dashboard"
            ) from None
        self._runner = runner
        port = int(runner.addresses[0][1])
        host = f"[{self.host}]" if ":" in self.host else self.host
        url = f"{self.access.scheme}://{host}:{port}/"
        log.info("dashboard on %s", url)
        return url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def build_app(access: DashboardAccess, status: StatusSource) -> web.Application:
    """The aiohttp application: routes, the access check and the security headers."""
    files = {name: _package_file(name) for name in (*_PAGES, *_STATIC)}
    app = web.Application(
        middlewares=[_access_check(access)],
        # The only request body is the login form: a token is 43 characters.
        client_max_size=16 << 10,
    )
    app.on_response_prepare.append(_add_security_headers)

    async def page(_request: web.Request) -> web.Response:
        return web.Response(body=files["index.html"], content_type="text/html", charset="utf-8")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _STATIC:
            raise web.HTTPNotFound()
        return web.Response(body=files[name], content_type=_STATIC[name], charset="utf-8")

    async def api_status(_request: web.Request) -> web.Response:
        body = await status.document()
        return web.Response(body=body, content_type="application/json", charset="utf-8")

    async def login_form(_request: web.Request) -> web.StreamResponse:
        if access.tokens is None:
            raise web.HTTPSeeOther("/")
        return _login_page(files["login.html"], message="")

    async def login(request: web.Request) -> web.StreamResponse:
        if access.tokens is None:
            raise web.HTTPSeeOther("/")
        form = await request.post()
        token = form.get("token")
        token = token.strip() if isinstance(token, str) else ""
        viewer = access.viewer(token)
        if viewer is None:
            log.warning("dashboard: refused a token from %s", request.remote)
            return _login_page(files["login.html"], message=REFUSED, status=401)
        log.info("dashboard: %r signed in from %s", viewer, request.remote)
        response = web.Response(status=303, headers={"Location": "/"})
        # The token itself, so a revoke shuts the browser out at its next poll.
        response.set_cookie(COOKIE, token, httponly=True, secure=True, samesite="Strict", path="/")
        return response

    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    return app


def _access_check(access: DashboardAccess) -> Middleware:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if access.tokens is None:
            if not is_loopback_host_header(request.host):
                raise web.HTTPMisdirectedRequest(
                    text="this dashboard answers only to localhost, 127.0.0.1 or [::1]"
                )
        elif request.path not in _OPEN_PATHS and access.viewer(_token_of(request)) is None:
            if request.path.startswith("/api/"):
                raise web.HTTPUnauthorized(
                    text=json.dumps({"error": "a valid token is required"}),
                    content_type="application/json",
                )
            raise web.HTTPSeeOther("/login")
        return await handler(request)

    return check


def _login_page(template: bytes, *, message: str, status: int = 200) -> web.Response:
    # The message is one of this module's constants, never anything a request sent.
    body = template.replace(b"<!--message-->", message.encode("utf-8"))
    return web.Response(body=body, status=status, content_type="text/html", charset="utf-8")


def _token_of(request: web.Request) -> str | None:
    """The bearer token of a request: the Authorization header (scripts), else the cookie."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(COOKIE)


async def _add_security_headers(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


def _package_file(name: str) -> bytes:
    return (resources.files("fedrl.server.dashboard") / "static" / name).read_bytes()
