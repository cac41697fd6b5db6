"""Per-participant limits: push rate, concurrent streams, idle half-finished streams.

Also how a refused upload ends: drain() reads the rest of it within bounds,
so the client gets the refusal instead of a transport error.

Each limit raises its own LimitError subclass whose message names the
limit and its value, and whose ``code`` is the gRPC status the servicer
answers with (RESOURCE_EXHAUSTED, or DEADLINE_EXCEEDED for a stalled stream).
Sizes are not repeated here: gRPC's own message limit (a server option)
answers RESOURCE_EXHAUSTED naming both sizes, and the chunk assembler's
DecodeLimits refuse oversized chunks with a DecodeError naming the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from fedrl.server.transport.call_context import REFUSALS, CallError

T = TypeVar("T")
R = TypeVar("R")

_PRUNE_ABOVE = 1024
"""Buckets kept before idle ones are swept; more participants than this is a big session."""


@dataclass(frozen=True)
class LimitsConfig:
    """The server's per-participant limits."""

    max_streams_per_participant: int = 8
    """Open streaming calls per participant; a sync loop needs 3-4 (push, pull, watch, exchange)."""
    push_rate_per_s: float = 20.0
    """Sustained pushes per second per participant: a member syncing in rounds of 128 env steps
    of a fast env pushes several times a second, and the limit must not pace its rounds."""
    push_burst: int = 10
    """Pushes allowed back to back, so an outbox flushed after an outage is not throttled."""
    stream_idle_timeout_s: float = 60.0
    """Longest wait for the next message of a half-finished upload before giving up on it."""

    def __post_init__(self) -> None:
        for name in ("max_streams_per_participant", "push_burst"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("push_rate_per_s", "stream_idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class LimitError(CallError):
    """A call went past a limit; the message says which one and its value."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class RateLimitError(LimitError):
    """Too many pushes in a short time."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        """Seconds until the next push would be accepted."""


class StreamLimitError(LimitError):
    """Too many streaming calls open at once."""


class StreamIdleError(LimitError):
    """A client stopped sending in the middle of a stream."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class RateLimiter:
    """A token bucket per participant: ``burst`` at once, then ``rate_per_s`` sustained.

    The clock is injectable so tests step time instead of sleeping.
    """

    def __init__(
        self,
        *,
        rate_per_s: float,
        burst: int,
        what: str = "push",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rate = rate_per_s
        self._burst = float(burst)
        self._what = what
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        """participant -> (tokens left, time of last refill)."""

    def acquire(self, participant_id: str) -> None:
        """Take one token for this participant, or raise RateLimitError saying when to retry."""
        now = self._clock()
        if len(self._buckets) > _PRUNE_ABOVE:
            self._forget_full(now)
        tokens, last = self._buckets.get(participant_id, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        if tokens < 1.0:
            self._buckets[participant_id] = (tokens, now)
            wait = (1.0 - tokens) / self._rate
            raise RateLimitError(
                f"{self._what} rate limit: at most {self._rate:g}/s per participant "
                f"(bursts of {self._burst:g}); retry in {wait:.1f} s",
                retry_after_s=wait,
            )
        self._buckets[participant_id] = (tokens - 1.0, now)

    def _forget_full(self, now: float) -> None:
        """Drop buckets that have refilled: a full bucket is the same as none, and ids
        that stopped calling (or were made up, on a plaintext server) must not pile up."""
        refill_s = self._burst / self._rate
        self._buckets = {p: b for p, b in self._buckets.items() if now - b[1] < refill_s}


class StreamCounter:
    """Counts open streaming calls per participant and refuses one past the limit.

    Used from one event loop: hold() neither awaits nor needs a lock.
    """

    def __init__(self, *, max_per_participant: int) -> None:
        self._max = max_per_participant
        self._open: dict[str, int] = {}

    def open_streams(self, participant_id: str) -> int:
        """How many streams this participant has open now."""
        return self._open.get(participant_id, 0)

    @contextmanager
    def hold(self, participant_id: str) -> Iterator[None]:
        """Count one stream for the duration of the block; StreamLimitError past the limit."""
        current = self._open.get(participant_id, 0)
        if current >= self._max:
            raise StreamLimitError(
                f"concurrent stream limit: at most {self._max} open streams per participant; "
                "finish or cancel one first"
            )
        self._open[participant_id] = current + 1
        try:
            yield
        finally:
            remaining = self._open[participant_id] - 1
            if remaining:
                self._open[participant_id] = remaining
            else:
                del self._open[participant_id]


async def with_idle_timeout(
    messages: AsyncIterable[T], timeout_s: float, *, what: str
) -> AsyncIterator[T]:
    """The messages of a client stream, raising StreamIdleError when the next one takes too long.

    Without this, a client that sends a header and stalls holds its stream
    slot and any buffered chunks forever.
    """
    iterator = aiter(messages)
    while True:
        try:
            message = await asyncio.wait_for(anext(iterator), timeout_s)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise StreamIdleError(
                f"stream idle timeout: no {what} message for {timeout_s:g} s; "
                "the half-finished stream was dropped"
            ) from None
        yield message


class _Sized(Protocol):
    def ByteSize(self) -> int: ...  # noqa: N802 - protobuf's name


async def drain(messages: AsyncIterator[_Sized], *, max_bytes: int, timeout_s: float) -> None:
    """Read and discard what is left of an upload, so that its status reaches the client intact.

    A grpc.aio client whose write fails because the server has already ended
    the call reports INTERNAL "Internal error from Core" instead of the
    server's status (grpc/grpc#36066), so answering a client-streaming call
    while the client is still writing turns a precise refusal (or a stored
    answer) into a transport error at random. Bounded: at most `timeout_s`
    in all and `max_bytes` of messages, then the answer goes out anyway; a
    client sending more or slower than that was not sending what it declared.
    A stream already ended, or dropped as idle (StreamIdleError), drains at once.
    """
    budget = max_bytes
    with contextlib.suppress(StreamIdleError, TimeoutError):
        async with asyncio.timeout(timeout_s):
            async for message in messages:
                budget -= message.ByteSize()
                if budget < 0:
                    return


class CallLimits:
    """One service's limits on each participant's calls: uploads rated, streams counted.

    Each service keeps its own, so a participant's experience pushes never
    use up its update pushes' budget, nor its population reports either.
    """

    def __init__(self, limits: LimitsConfig, *, max_upload_bytes: int, what: str = "push") -> None:
        """`max_upload_bytes`: the largest upload the service accepts (what drain reads)."""
        self.rate = RateLimiter(
            rate_per_s=limits.push_rate_per_s, burst=limits.push_burst, what=what
        )
        self.streams = StreamCounter(max_per_participant=limits.max_streams_per_participant)
        self.idle_s = limits.stream_idle_timeout_s
        self._max_upload_bytes = max_upload_bytes

    def incoming(self, requests: AsyncIterable[T], what: str) -> AsyncIterator[T]:
        """An upload's messages, dropped if the sender stalls longer than the idle timeout."""
        return with_idle_timeout(requests, self.idle_s, what=what)

    async def drain(self, messages: AsyncIterator[Any]) -> None:
        """drain() up to the largest upload the service accepts and its idle timeout."""
        await drain(messages, max_bytes=self._max_upload_bytes, timeout_s=self.idle_s)

    async def upload(
        self,
        key: str,
        requests: AsyncIterable[T],
        what: str,
        handle: Callable[[AsyncIterator[T]], Awaitable[R]],
    ) -> R:
        """Run `handle` on an upload's messages once it passed the stream and rate limits.

        Whatever `handle` answers, the rest of the stream is read first (see
        drain): a refusal or a stored answer often comes before the client
        has sent its last chunk.
        """
        # Dropped if the sender stalls, while handled and while drained.
        messages = self.incoming(requests, what)
        try:
            with self.streams.hold(key):
                self.rate.acquire(key)
                result = await handle(messages)
        except REFUSALS:
            await self.drain(messages)
            raise
        await self.drain(messages)
        return result
