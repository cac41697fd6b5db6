"""global_state.json: the server's status as a file, rewritten soon after anything changes.

It is a copy for people who `cat` it (the database is the record), so a new
version or a join never waits for its JSON and fsync: a change only asks for
a rewrite, and changes made while one runs are folded into one more rewrite
after it. The federation calls `changed` and, once its last versions are
folded and before its database closes, `closing` (the last rewrite).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from fedrl.common.durable_files import remove_abandoned_temp_files, write_atomically
from fedrl.common.status_file import status_to_json
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.names import GLOBAL_STATE_FILE

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 1.0
"""Shortest time between two rewrites while changes keep coming: a busy server makes several
versions a second, its readers need no more than a fresh copy a second, and the CPU goes to
pushes."""


class GlobalStateFile:
    """Keeps `<data dir>/global_state.json` up to date with what `read` returns."""

    def __init__(self, data_dir: Path, read: Callable[[], Awaitable[pb.StatusReply]]) -> None:
        self._path = data_dir / GLOBAL_STATE_FILE
        self._read = read
        self._dirty = False
        self._writer: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Remove what a crash in the middle of a rewrite left, and write the file once."""
        remove_abandoned_temp_files(self._path.parent, re.compile(re.escape(self._path.name)))
        await self._write()

    def changed(self) -> None:
        """Have the file rewritten soon, without waiting for it."""
        self._dirty = True
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._rewrite(), name="fedrl-global-state")

    async def closing(self) -> None:
        """The last rewrite, once nothing changes any more."""
        if self._writer is not None:
            # The final write below covers whatever it would have written.
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        await self._write()

    async def _rewrite(self) -> None:
        while self._dirty:
            self._dirty = False
            try:
                await self._write()
            except Exception:
                log.exception("writing %s failed; retried at the next change", self._path.name)
            await asyncio.sleep(MIN_INTERVAL_S)

    async def _write(self) -> None:
        reply = await self._read()
        # Formatting and fsync off the database thread, where acks wait their turn.
        await asyncio.to_thread(write_status_json, self._path, reply)


def write_status_json(path: Path, reply: pb.StatusReply) -> None:
    """Replace `path` with the status as JSON; readers see the old or the new file, never half.

    Unique temporary names: a rewrite still running on a worker thread when
    the server's last one starts (at shutdown) must not share its file.
    """
    data = (status_to_json(reply) + "\n").encode("utf-8")
    write_atomically(path, lambda file: file.write(data), unique=True)
