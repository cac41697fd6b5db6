"""The web dashboard without a browser: its JSON against the Status RPC, and who may see it.

tests/test_dashboard_browser.py drives the page itself in headless Chromium.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from fedrl.common.identity import validate_participant_id
from fedrl.common.tls import TlsPaths, create_ca, issue_server_cert, write_private
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.cli import main
from fedrl.server.config import ServerConfig
from fedrl.server.dashboard.access import is_loopback_host_header
from fedrl.server.dashboard.status_json import status_document
from fedrl.server.dashboard.web import Dashboard, StatusSource
from fedrl.server.federation.federation import Federation
from fedrl.server.names import DB_FILE
from fedrl.server.security.auth import InsecureBindError, issue_token, revoke
from fedrl.server.status.read_model import ServerStatus
from tests.support.server_harness import (
    InProcessServer,
    ServerProcess,
    join,
    make_spec,
    push,
    seed,
    server_config,
)

SPEC = make_spec([(4,)])
IDS = [
    "Макар",
    "李雷",
    validate_participant_id("q\u0323\u0307"),  # combining marks with no precomposed form
    "&lt;b&gt;x&amp;",  # markup if a page ever parsed it as HTML
    "'onmouseover='1",
]
SCRIPT = Path(__file__).resolve().parents[1] / "server" / "dashboard" / "static" / "dashboard.js"


def start_dashboard(server: InProcessServer, **overrides: Any) -> tuple[Dashboard, str]:
    config = dataclasses.replace(server.config, dashboard_port=0, **overrides)
    dashboard = Dashboard.for_config(config)
    assert server.running is not None
    return dashboard, server.call(dashboard.start(server.running.status.read))


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    """(status, headers, body) of a GET, also for error statuses."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def wait_for_version(server: InProcessServer, version: int) -> None:
    stub = server.stub()
    deadline = time.monotonic() + 60
    while stub.Status(pb.StatusRequest()).sessions[0].current_version < version:
        assert time.monotonic() < deadline, f"no version {version} within a minute"
        time.sleep(0.05)


def without_time(document: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != "server_time_unix_ms"}


def test_the_status_json_says_what_the_status_rpc_says_with_every_id_exact(
    tmp_path: Path,
) -> None:
    # prepare
    with InProcessServer(server_config(tmp_path / "data", buffer_size=1)) as server:
        stub = server.stub()
        for pid in IDS:
            join(stub, pid, SPEC)
        seed(stub, IDS[0], SPEC, [np.zeros(4, np.float32)])
        evaluated = pb.UpdateMetrics(base_eval_return=12.5, mean_return=9.0)
        for sequence, pid in enumerate(IDS[:2], start=1):
            push(
                stub, pid, SPEC, [np.ones(4, np.float32)], sequence=sequence, base_version=0,
                env_steps=100 * sequence, episodes=3, metrics=evaluated,
            )  # fmt: skip
        wait_for_version(server, 2)
        dashboard, url = start_dashboard(server)

        # act
        status, headers, body = fetch(url + "api/status")
        reply = stub.Status(pb.StatusRequest(max_versions=1000))
        server.call(dashboard.stop())

    # assert
    assert status == 200
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    assert "Макар".encode() in body  # UTF-8 as it is, not \u escapes
    document = json.loads(body)
    assert without_time(document) == without_time(status_document(reply))
    session = document["sessions"][0]
    assert sorted(p["participant_id"] for p in session["participants"]) == sorted(IDS)
    assert [(v["version"], v["env_steps"]) for v in session["versions"]] == [
        (2, 300),
        (1, 100),
        (0, 0),
    ]
    assert session["versions"][-1]["eval_return"] == 12.5
    assert session["versions"][0]["contributors"] == [IDS[1]]
    assert session["goal"] == {"total_episodes": 1000, "episodes_done": 6, "reached": False}


def test_an_open_dashboard_answers_only_requests_that_name_this_machine(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data")) as server:
        dashboard, url = start_dashboard(server)
        port = url.rsplit(":", 1)[1].strip("/")

        rebound, _, _ = fetch(url + "api/status", {"Host": f"attacker.example:{port}"})
        by_name, _, _ = fetch(url + "api/status", {"Host": f"localhost:{port}"})
        by_v6, _, _ = fetch(url + "api/status", {"Host": f"[::1]:{port}"})
        server.call(dashboard.stop())

    assert rebound == 421
    assert (by_name, by_v6) == (200, 200)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost:7444", True),
        ("LocalHost", True),
        ("127.0.0.1", True),
        ("127.8.9.1:80", True),
        ("[::1]:7444", True),
        ("localhost.attacker.example", False),
        ("127.0.0.1.attacker.example:7444", False),
        ("0.0.0.0:7444", False),
        ("[::1", False),
        ("", False),
    ],
)
def test_host_headers_pass_only_when_they_name_a_loopback_address(
    host: str, loopback: bool
) -> None:
    assert is_loopback_host_header(host) is loopback


@given(st.text())
def test_any_host_header_is_judged_without_raising(host: str) -> None:
    assert isinstance(is_loopback_host_header(host), bool)


def test_every_response_forbids_inline_script_framing_and_sniffing(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data")) as server:
        dashboard, url = start_dashboard(server)

        responses = {
            path: fetch(url + path)
            for path in ("", "static/dashboard.js", "static/dashboard.css", "api/status", "nope")
        }
        server.call(dashboard.stop())

    assert [status for status, _, _ in responses.values()] == [200, 200, 200, 200, 404]
    for _, headers, _ in responses.values():
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
    assert responses[""][1]["Content-Type"] == "text/html; charset=utf-8"
    assert b"<script" not in responses[""][2].replace(b'<script src="/static/dashboard.js"', b"")


def test_the_page_script_never_hands_server_text_to_the_html_parser() -> None:
    code = SCRIPT.read_text(encoding="utf-8")

    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in code, sink


def test_plaintext_off_loopback_is_refused_before_any_state_is_opened(tmp_path: Path) -> None:
    data = tmp_path / "data"

    with pytest.raises(InsecureBindError, match="init-tls"):
        Dashboard.for_config(ServerConfig(data_dir=data, dashboard_host="0.0.0.0"))
    result = CliRunner().invoke(
        main, ["serve", "--data-dir", str(data), "--port", "0", "--dashboard-host", "0.0.0.0",
               "--insecure"],
    )  # fmt: skip

    assert result.exit_code == 2, result.output
    assert "refusing to serve the dashboard on '0.0.0.0'" in result.output
    assert not (data / DB_FILE).exists()


def make_tls(data: Path) -> TlsPaths:
    """What `fedrl-server init-tls --host 127.0.0.1` leaves in the data dir."""
    paths = TlsPaths.for_data_dir(data)
    ca = create_ca("test session CA")
    server = issue_server_cert(ca, ["127.0.0.1"])
    write_private(paths.ca_cert, ca.cert_pem)
    write_private(paths.ca_key, ca.key_pem)
    write_private(paths.server_cert, server.cert_pem)
    write_private(paths.server_key, server.key_pem)
    return paths


def test_off_loopback_it_speaks_only_tls_and_only_to_holders_of_an_unrevoked_token(
    tmp_path: Path,
) -> None:
    # prepare
    paths = make_tls(tmp_path / "data")
    token = issue_token(paths, "operator")
    config = ServerConfig(
        data_dir=tmp_path / "data", port=0, dashboard_host="0.0.0.0", dashboard_port=0
    )
    trust = ssl.create_default_context(cafile=str(paths.ca_cert))
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        federation = await Federation.open(config)
        dashboard = Dashboard.for_config(config)
        url = await dashboard.start(ServerStatus(federation).read)
        port = int(url.rsplit(":", 1)[1].strip("/"))
        base = f"https://127.0.0.1:{port}"
        seen["url"] = url
        try:
            # IP-address hosts keep cookies only with an unsafe jar.
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(cookie_jar=jar) as http:
                try:
                    await http.get(f"http://127.0.0.1:{port}/api/status")
                except aiohttp.ClientError as exc:
                    seen["plaintext"] = exc

                async def status_of(path: str, **kwargs: Any) -> int:
                    async with http.get(base + path, ssl=trust, **kwargs) as response:
                        return response.status

                seen["no token"] = await status_of("/api/status")
                seen["wrong token"] = await status_of(
                    "/api/status", headers={"Authorization": "Bearer wrong"}
                )
                seen["bearer"] = await status_of(
                    "/api/status", headers={"Authorization": f"Bearer {token}"}
                )
                async with http.get(base + "/", ssl=trust, allow_redirects=False) as response:
                    seen["page without cookie"] = (response.status, response.headers["Location"])
                async with http.post(
                    base + "/login", data={"token": "wrong"}, ssl=trust
                ) as response:
                    seen["wrong login"] = (response.status, await response.text())
                async with http.post(
                    base + "/login", data={"token": token}, ssl=trust, allow_redirects=False
                ) as response:
                    seen["login"] = (response.status, response.headers["Set-Cookie"])
                seen["page with cookie"] = await status_of("/")
                seen["api with cookie"] = await status_of("/api/status")
                revoke(paths, "operator")
                seen["after revoke"] = await status_of("/api/status")
        finally:
            await dashboard.stop()
            await federation.close()

    # act
    asyncio.run(scenario())

    # assert
    assert seen["url"].startswith("https://0.0.0.0:")
    assert isinstance(seen["plaintext"], aiohttp.ClientError)
    assert (seen["no token"], seen["wrong token"], seen["bearer"]) == (401, 401, 200)
    assert seen["page without cookie"] == (303, "/login")
    assert seen["wrong login"][0] == 401
    assert "unknown or has been revoked" in seen["wrong login"][1]
    status, cookie = seen["login"]
    assert status == 303
    assert all(flag in cookie for flag in ("HttpOnly", "Secure", "SameSite=Strict"))
    assert (seen["page with cookie"], seen["api with cookie"]) == (200, 200)
    assert seen["after revoke"] == 401


class CountingStatus:
    """Stands in for the status read model, counting reads."""

    def __init__(self) -> None:
        self.reads = 0

    async def read(self, session: str, max_versions: int) -> pb.StatusReply:
        self.reads += 1
        await asyncio.sleep(0.01)
        return pb.StatusReply(server_time_unix_ms=self.reads)


def test_viewers_share_one_status_read_per_second() -> None:
    status = CountingStatus()
    now = [100.0]
    source = StatusSource(status.read, max_versions=10, clock=lambda: now[0])

    async def scenario() -> list[bytes]:
        together = await asyncio.gather(*(source.document() for _ in range(5)))
        now[0] += 0.5
        cached = await source.document()
        now[0] += 0.6
        fresh = await source.document()
        return [*together, cached, fresh]

    documents = [json.loads(d)["server_time_unix_ms"] for d in asyncio.run(scenario())]

    assert documents == [1, 1, 1, 1, 1, 1, 2]
    assert status.reads == 2


def test_serve_prints_the_dashboard_url_and_a_taken_port_fails_with_what_to_do(
    tmp_path: Path,
) -> None:
    with ServerProcess(tmp_path / "first") as first:
        status, _, body = fetch(first.dashboard_url)
        taken = first.dashboard_url.rsplit(":", 1)[1].strip("/")
        refused = CliRunner().invoke(
            main, ["serve", "--data-dir", str(tmp_path / "second"), "--port", "0",
                   "--dashboard-port", taken],
        )  # fmt: skip
        with ServerProcess(
            tmp_path / "third", "--dashboard-port", taken, "--no-dashboard"
        ) as third:
            without = third.dashboard_url

    assert first.dashboard_url.startswith("http://127.0.0.1:")
    assert status == 200 and b"/static/dashboard.js" in body
    assert refused.exit_code == 1
    assert f"cannot serve the dashboard on 127.0.0.1:{taken}" in refused.output
    assert "--no-dashboard" in refused.output
    assert without == ""
