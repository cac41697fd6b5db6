"""Fixtures the test modules share; helpers they import live in tests/support/."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Plain asserts in the helpers report their values too, as in a test.
pytest.register_assert_rewrite("tests.support")

from tests.support.experience import Server  # noqa: E402  (after the rewrite hook)
from tests.support.server_harness import InProcessServer, server_config  # noqa: E402


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., InProcessServer]]:
    """Start a real in-process server on tmp_path/"server" with config overrides.

    Every server started this way is stopped after the test, whatever happened.
    """
    started: list[InProcessServer] = []

    def start(**overrides: Any) -> InProcessServer:
        server = InProcessServer(server_config(tmp_path / "server", **overrides)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def experience_server(tmp_path: Path) -> Iterator[Server]:
    """A real server with the experience service on tmp_path/"server", stopped after the test."""
    server = Server(tmp_path / "server").start()
    yield server
    server.stop()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny networks: a second intra-op thread only fights the other processes on a
    shared 2-core machine (measured 30x slower under load)."""
    import torch  # noqa: PLC0415  (the server's tests do not need torch loaded)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
