"""The network thread: one participant's link to the server, on an asyncio loop of its own.

Training never waits for the network. The engine's poll loop runs in the
main thread; all gRPC traffic runs on an asyncio loop in one background
thread, which the link owns. The two threads meet only in what the sync
parts hand over under their own locks (fedrl.client.federation.weight_sync
and experience_sync) and in the link's `ServerView`, so actors and learner
keep going through slow pulls, outages and server restarts.

The link keeps the membership and listens to the session. It joins (the
server compares the model spec there), then holds a WatchVersions stream:
the server sends one notice when the stream opens and one whenever the
session's version, goal or active participants change, so a new global
version is noticed at once, not at the next poll (nothing polls). When the
stream breaks (an outage, a server restart, a dead connection found by the
channel's keepalive pings) the view says "not connected", training goes on,
and after a capped, jittered backoff the link joins again (a restarted
server counts it active again, and the reply says which pushes it holds)
and reopens the stream, whose first notice carries whatever was missed.

The sync parts run their traffic as tasks on the link's loop (`add_task`).
A task runs when its part wakes it (new work in the outbox), after every
join, and after every notice if it asked for them; it retries an outage
with its own backoff and stops the federation loudly on a refusal or a bug.
One task per part, so a slow or hanging transfer of one (a frozen server:
transfer deadlines are long) never holds the other back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import grpc

from fedrl.client.federation.backoff import Backoff, BackoffPolicy
from fedrl.client.federation.errors import (
    RejectedError,
    SpecMismatchError,
    SyncError,
    UnavailableError,
)
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.loop_thread import LoopThread
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

log = logging.getLogger(__name__)

T = TypeVar("T")
JoinHook = Callable[[FederationClient, pb.JoinReply], Awaitable[None]]
"""What a sync part does at every join, before any task runs: e.g. seed an empty session."""


@dataclass(frozen=True)
class ServerView:
    """The latest facts heard from the server, for progress display and the stop decision."""

    connected: bool = False
    version: int = -1
    goal: pb.GoalState | None = None
    active_participants: int = 0
    pushing_participants: int = 0
    """Members whose updates the server heard lately: the group a synchronous round waits for."""
    acknowledged: int = 0
    """Updates acknowledged during this run."""
    duplicates: int = 0
    """Acknowledgements that were answers to a resend (recognised by the server)."""
    session: pb.SessionConfig = field(default_factory=pb.SessionConfig)
    """The session's settings from the last join (defaults before the first)."""

    @property
    def push_spacing_s(self) -> float:
        """Seconds between two pushes of one kind that keep within the server's rate limit.

        Pacing to it, rather than being refused with RESOURCE_EXHAUSTED and
        retrying, keeps the logs quiet and the updates fresh: what is not
        pushed yet goes with the next push.
        """
        rate = self.session.push_rate_per_s
        return 1.0 / rate if rate > 0 else 0.0


@dataclass
class _Task:
    what: str
    work: Callable[[], Awaitable[None]]
    on_join: JoinHook | None
    on_notice: bool
    # Created unbound: it attaches to the link's loop at its first wait.
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class ServerLink:
    """All gRPC traffic of one participant, on an asyncio loop in a background thread."""

    def __init__(
        self,
        *,
        channel_factory: Callable[[], grpc.aio.Channel],
        participant_id: str,
        session: str,
        spec: tpb.ModelSpec,
        backoff: BackoffPolicy,
    ) -> None:
        self._channel_factory = channel_factory
        self._participant_id = participant_id
        self._session = session
        self._spec = spec
        self._backoff = backoff
        self._loop = LoopThread("fedrl-sync")
        self._tasks: list[_Task] = []
        self._running: list[asyncio.Task[None]] = []
        self._client: FederationClient | None = None
        self._channel: grpc.aio.Channel | None = None
        # Network thread only.
        self._member = asyncio.Event()
        self._join_lock = asyncio.Lock()
        self._waiters: set[asyncio.Event] = set()
        """One per wait_until under way: set whenever a task finished its work or a notice came."""
        # Shared with the main thread, under _lock.
        self._lock = threading.Lock()
        self._view = ServerView()
        self._fatal: Exception | None = None

    # Main-thread side.

    def start(self) -> None:
        self._loop.start()
        self.call(self._open())

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the link's loop and wait for its result."""
        return self._loop.call(coroutine, timeout)

    def add_task(
        self,
        what: str,
        work: Callable[[], Awaitable[None]],
        *,
        on_join: JoinHook | None = None,
        on_notice: bool = False,
    ) -> Callable[[], None]:
        """Have `work` run on the link's loop; returns the function that wakes it (any thread).

        Add every task before run_in_background(). `on_join` runs at every
        join, before the tasks are woken; `on_notice` wakes the task at every
        notice of the session too.
        """
        task = _Task(what, work, on_join, on_notice)
        self._tasks.append(task)

        def wake() -> None:
            self._loop.call_soon(task.wake.set)

        return wake

    def probe(self, timeout_s: float) -> pb.JoinReply:
        """Join without running the parts' hooks; SyncError if the session refuses this model."""
        return self.call(asyncio.wait_for(self._join_only(), timeout_s), timeout_s + 5)

    def connect(self) -> pb.JoinReply:
        """Join now, running the parts' hooks; raises what Join raises."""
        return self.call(self.join())

    def run_in_background(self) -> None:
        """Start watching the session and every task, until close()."""
        self.call(self._spawn())

    @property
    def view(self) -> ServerView:
        with self._lock:
            return self._view

    @property
    def fatal(self) -> Exception | None:
        """The error that stopped the federation, if one did."""
        with self._lock:
            return self._fatal

    @property
    def chunk_bytes(self) -> int:
        """Chunk size the server asks for (its default before the first join)."""
        return self.client.chunk_bytes

    def wait_until(
        self, settled: Callable[[], bool], *, wake: Callable[[], None], timeout_s: float
    ) -> bool:
        """Wait until `settled()` holds or the federation stopped; False if time ran out.

        `settled` is asked on the link's loop; `wake` is called with it, so a
        task that has work left does it now rather than at its next wake.
        """

        async def wait() -> None:
            # Asked again after each finished task or notice rather than on a
            # clock, so a synchronous round waits milliseconds, not a polling
            # period. The task is woken again only when 0.1 s pass quietly:
            # waking it after each of its own no-op runs would spin the loop.
            progressed = asyncio.Event()
            self._waiters.add(progressed)
            try:
                wake()
                while not settled() and self.fatal is None:
                    progressed.clear()
                    try:
                        await asyncio.wait_for(progressed.wait(), 0.1)
                    except TimeoutError:
                        wake()
            finally:
                self._waiters.discard(progressed)

        try:
            self.call(asyncio.wait_for(wait(), timeout_s), timeout_s + 5)
        except TimeoutError:
            return False
        return True

    def raise_goal(self, total_episodes: int) -> pb.GoalState:
        return self.call(self.client.raise_goal(total_episodes))

    def status(self) -> pb.StatusReply:
        return self.call(self.client.status())

    def leave(self, reason: str) -> None:
        with contextlib.suppress(UnavailableError, RejectedError):
            self.call(self.client.leave(reason), timeout=20)

    def close(self) -> None:
        """Stop the tasks, close the channel, and end the loop with nothing left pending."""
        self._loop.close(self._close())

    # Network-thread side, for the sync parts.

    @property
    def client(self) -> FederationClient:
        if self._client is None:
            raise RuntimeError("link not started")
        return self._client

    @property
    def channel(self) -> grpc.aio.Channel:
        """The channel, for the clients of other services (the experience exchange)."""
        if self._channel is None:
            raise RuntimeError("link not started")
        return self._channel

    async def join(self) -> pb.JoinReply:
        """Join (again): run every part's join hook, then wake every task."""
        async with self._join_lock:
            reply = await self._join_only()
            self.update_view(version=reply.current_version, session=reply.config)
            for task in self._tasks:
                if task.on_join is not None:
                    await task.on_join(self.client, reply)
            # Connected only now: whoever acts on it (e.g. a final push that
            # needs a global model) finds the session seeded.
            self.update_view(connected=True, goal=reply.goal)
            self._member.set()
            for task in self._tasks:
                task.wake.set()
            return reply

    def update_view(self, **changes: Any) -> None:
        with self._lock:
            self._view = replace(self._view, **changes)

    # Internals.

    async def _open(self) -> None:
        self._channel = self._channel_factory()
        self._client = FederationClient(
            self._channel, participant_id=self._participant_id, session=self._session
        )

    async def _spawn(self) -> None:
        self._running = [asyncio.create_task(self._watch())]
        self._running += [asyncio.create_task(self._run(task)) for task in self._tasks]

    async def _close(self) -> None:
        for running in self._running:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        if self._channel is not None:
            await self._channel.close()

    async def _join_only(self) -> pb.JoinReply:
        try:
            return await self.client.join(self._spec)
        except SpecMismatchError as exc:
            raise SyncError(str(exc)) from None

    async def _watch(self) -> None:
        """Stay a member and keep the view current: join, follow the notices, rejoin when lost."""
        backoff = Backoff(self._backoff)
        while True:
            try:
                if not self._member.is_set():
                    await self.join()
                async with contextlib.aclosing(self.client.watch_versions()) as notices:
                    async for notice in notices:
                        if backoff.failures:
                            log.warning("server reachable again")
                        backoff.succeeded()
                        self._heard(notice)
                # The server ends the stream when it shuts down.
                raise UnavailableError("the server closed the version stream")
            except (UnavailableError, RejectedError) as exc:
                if isinstance(exc, RejectedError) and exc.code != grpc.StatusCode.NOT_FOUND:
                    self._stop("the session watch", exc)
                    return
                # NOT_FOUND: the server does not know the session (restored
                # from an older backup); joining creates it again.
                self._member.clear()
                self.update_view(connected=False)
                delay = backoff.failed()
                log.warning(
                    "server unreachable (%s); training goes on, retry %d in %.1f s",
                    exc,
                    backoff.failures,
                    delay,
                )
                await asyncio.sleep(delay)
            except Exception as exc:
                self._stop("the session watch", exc)
                return

    def _heard(self, notice: pb.VersionNotice) -> None:
        self.update_view(
            connected=True,
            version=notice.current_version,
            goal=notice.goal,
            active_participants=notice.active_participants,
            pushing_participants=notice.pushing_participants,
        )
        for task in self._tasks:
            if task.on_notice:
                task.wake.set()
        self._progressed()

    def _progressed(self) -> None:
        for waiter in self._waiters:
            waiter.set()

    async def _run(self, task: _Task) -> None:
        """Run one part's work whenever it is woken while a member; back off through outages."""
        backoff = Backoff(self._backoff)
        while True:
            await self._member.wait()
            # Cleared before the work, so a wake during it is not missed.
            task.wake.clear()
            try:
                await task.work()
            except UnavailableError as exc:
                delay = backoff.failed()
                log.warning(
                    "%s failed (%s); training goes on, retry %d in %.1f s",
                    task.what,
                    exc,
                    backoff.failures,
                    delay,
                )
                # A wake does not cut a backoff short: that would turn an
                # outage into a retry storm at the pace of training.
                await asyncio.sleep(delay)
                continue
            except Exception as exc:
                self._stop(task.what, exc)
                self._progressed()
                return
            backoff.succeeded()
            self._progressed()
            await task.wake.wait()

    def _stop(self, what: str, exc: Exception) -> None:
        """Stop the federation: a refusal or a bug must stop the run loudly, not leave it
        training without a sync while the outbox silently fills."""
        with self._lock:
            if self._fatal is None:
                self._fatal = exc
        if isinstance(exc, RejectedError | SyncError):
            log.error("federation stopped by %s: %s", what, exc)
        else:
            log.exception("federation stopped by an unexpected error in %s", what)
