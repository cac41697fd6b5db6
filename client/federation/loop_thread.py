"""An asyncio loop on a background thread of its own, which other threads hand coroutines to.

A participant's gRPC traffic runs on such a loop (fedrl.client.federation.server_link and
population) while training keeps the main thread. close() ends it the way asyncio.run ends
its loop: whatever is still pending there — gRPC's own tasks of a call that a closed channel
just cancelled, say — is given a moment, then cancelled and awaited, and async generators are
finalized before the loop closes. A loop stopped with a task pending would leave that task to
the garbage collector, which reports "Task was destroyed but it is pending!".
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

SETTLE_S = 1.0
"""How long tasks left at close may run on before they are cancelled: a call that a closed
channel cancelled finishes within milliseconds."""
DRAIN_S = 0.05
"""How long a settled loop keeps running before it closes. gRPC hands a call's completion events
to the call's loop through a queue every loop in the process reads; an event still queued when
its loop closes is passed on by another loop, which then logs "Event loop is closed"."""
CANCEL_ROUNDS = 10
"""Rounds of settling what is left, each of which may leave tasks that cleaning up started."""


class LoopThread:
    """One event loop, run by one daemon thread from start() until close()."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Run a coroutine on the loop; its result arrives in the returned future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the loop and wait for its result (TimeoutError after `timeout`)."""
        return self.submit(coroutine).result(timeout)

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Have the loop call `callback` (from any thread)."""
        self.loop.call_soon_threadsafe(callback)

    def close(
        self, last: Coroutine[Any, Any, None] | None = None, *, timeout: float = 30.0
    ) -> None:
        """Run `last` (e.g. close the channel), settle every task left, stop and close the loop.

        Calling it again does nothing. `last` is closed unawaited when the loop never started.
        """
        if self._thread.is_alive():
            try:
                self.call(_finish(last), timeout)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join(timeout)
        elif last is not None:
            last.close()
        if not self.loop.is_closed() and not self._thread.is_alive():
            self.loop.close()


async def _finish(last: Coroutine[Any, Any, None] | None) -> None:
    try:
        if last is not None:
            await last
    finally:
        await settle_tasks()
        await asyncio.sleep(DRAIN_S)


async def settle_tasks(grace_s: float = SETTLE_S) -> None:
    """Let the loop's other tasks end within `grace_s`, cancel and await those that do not,
    and finalize its async generators: what asyncio.run does before it closes a loop."""
    current = asyncio.current_task()
    deadline = asyncio.get_running_loop().time() + grace_s
    # Closing a channel schedules callbacks that start gRPC's clean-up tasks: one turn of the
    # loop first, then rounds until none is left, since ending a task may start another.
    await asyncio.sleep(0)
    for _ in range(CANCEL_ROUNDS):
        others = asyncio.all_tasks() - {current}
        if not others:
            break
        left = max(0.0, deadline - asyncio.get_running_loop().time())
        _, pending = await asyncio.wait(others, timeout=left)
        for task in pending:
            task.cancel()
        for outcome in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.debug("a task left at close ended with %r", outcome)
        await asyncio.sleep(0)
    else:
        log.warning("tasks still pending at close: %s", asyncio.all_tasks() - {current})
    await asyncio.get_running_loop().shutdown_asyncgens()
