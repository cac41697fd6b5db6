"""A loopback port nothing listens on, for a server or a rank group a test starts itself."""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

_BLOCK = 1_000
"""Ports per test process (pytest-xdist worker)."""
_FIRST = 20_000
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_next = itertools.count()


def free_port() -> int:
    """A port free on 127.0.0.1 now, that no other test process and no OS-assigned socket takes.

    A port from bind(0) comes from the kernel's ephemeral range, which every
    socket bound to port 0 (servers on port 0, gloo's own listeners, the other
    test processes' probes) draws from too, so it can be taken between this
    check and the test's own bind. Ports below that range, in a block of its
    own per xdist worker, are not; where the range leaves no room for the
    blocks, bind(0) is the fallback.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    base = _FIRST + _BLOCK * (int(worker) if worker.isdigit() else 0)
    if base + _BLOCK <= _ephemeral_start():
        for _ in range(_BLOCK):
            port = base + next(_next) % _BLOCK
            if _bindable(port):
                return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
