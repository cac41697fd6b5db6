"""Waiting for a condition another process or thread brings about, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """Return once condition() is true; fail the test, naming `what`, after timeout_s.

    For what nothing announces (a file, another process's output); where
    the server announces a change (a version: WatchVersions), wait for that.
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
