"""`fedrl-server --port 0` gives its dashboard a free port too: servers side by side start."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from fedrl.server.config import DASHBOARD_PORT, ServerConfig
from fedrl.server.launcher import ServerStartError
from tests.support.server_harness import ServerProcess


def test_the_dashboard_port_follows_the_server_port_unless_given() -> None:
    assert ServerConfig().dashboard_listen_port == DASHBOARD_PORT
    assert ServerConfig(port=9000).dashboard_listen_port == DASHBOARD_PORT
    assert ServerConfig(port=0).dashboard_listen_port == 0
    assert ServerConfig(port=0, dashboard_port=DASHBOARD_PORT).dashboard_listen_port == (
        DASHBOARD_PORT
    )
    assert ServerConfig(dashboard_port=0).dashboard_listen_port == 0


def test_two_servers_on_port_0_start_side_by_side_and_each_dashboard_serves(
    tmp_path: Path,
) -> None:
    # prepare: `--dashboard-port none` takes back the launcher's own 0, as a user leaves it out
    first = ServerProcess(tmp_path / "a", "--dashboard-port", "none")
    second = ServerProcess(tmp_path / "b", "--dashboard-port", "none")

    # act
    with first, second:
        urls = [first.dashboard_url, second.dashboard_url]
        pages = [urllib.request.urlopen(url, timeout=30) for url in urls]

    # assert
    assert all(urls) and urls[0] != urls[1]
    assert [page.status for page in pages] == [200, 200]


def test_a_dashboard_port_given_and_taken_fails_saying_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ServerProcess(tmp_path / "data", "--dashboard-port", str(port))

        with pytest.raises(ServerStartError) as failed:
            server.start()

    said = "".join(server.output)
    assert f"cannot serve the dashboard on 127.0.0.1:{port}" in said, failed.value
    assert "pass another --dashboard-port (0 for any free one) or --no-dashboard" in said
