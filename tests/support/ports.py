"""A loopback port nothing listens on, for a server or a rank group a test starts itself."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the OS just handed out on 127.0.0.1 and released (free unless raced for)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
