"""Per-participant limits: each refusal names its limit and carries the right status code."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from fedrl.common.identity import id_from_metadata, id_to_metadata
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.transport.limits import (
    LimitError,
    LimitsConfig,
    RateLimiter,
    RateLimitError,
    StreamCounter,
    StreamIdleError,
    StreamLimitError,
    with_idle_timeout,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_push_rate_allows_a_burst_then_refuses_naming_the_limit() -> None:
    limiter = RateLimiter(rate_per_s=0.5, burst=3, clock=_Clock())
    for _ in range(3):
        limiter.acquire("Макар")

    with pytest.raises(RateLimitError, match=r"push rate limit: at most 0.5/s") as info:
        limiter.acquire("Макар")

    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.retry_after_s == pytest.approx(2.0)


def test_push_rate_refills_with_time() -> None:
    clock = _Clock()
    limiter = RateLimiter(rate_per_s=0.5, burst=1, clock=clock)
    limiter.acquire("Макар")

    clock.now += 2.0
    limiter.acquire("Макар")

    with pytest.raises(RateLimitError):
        limiter.acquire("Макар")


def test_refused_pushes_do_not_push_the_retry_time_back() -> None:
    clock = _Clock()
    limiter = RateLimiter(rate_per_s=1.0, burst=1, clock=clock)
    limiter.acquire("Макар")
    clock.now += 0.5
    with pytest.raises(RateLimitError):
        limiter.acquire("Макар")

    clock.now += 0.5
    limiter.acquire("Макар")


def test_forgetting_idle_participants_does_not_reset_an_empty_bucket() -> None:
    clock = _Clock()
    limiter = RateLimiter(rate_per_s=1.0, burst=1, clock=clock)
    limiter.acquire("Макар")
    for i in range(2000):
        limiter.acquire(f"p{i}")

    with pytest.raises(RateLimitError):
        limiter.acquire("Макар")


def test_push_rate_is_per_participant() -> None:
    limiter = RateLimiter(rate_per_s=1.0, burst=1, clock=_Clock())
    limiter.acquire("Макар")

    limiter.acquire("Иван")

    with pytest.raises(RateLimitError):
        limiter.acquire("Макар")


def test_stream_limit_refuses_one_too_many_and_frees_slots_on_error() -> None:
    counter = StreamCounter(max_per_participant=2)
    with (
        counter.hold("Макар"),
        counter.hold("Макар"),
        pytest.raises(StreamLimitError, match="at most 2 open streams") as info,
        counter.hold("Макар"),
    ):
        pass
    with pytest.raises(RuntimeError), counter.hold("Макар"):
        raise RuntimeError("handler failed")

    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert counter.open_streams("Макар") == 0


def test_stream_limit_is_per_participant() -> None:
    counter = StreamCounter(max_per_participant=1)

    with counter.hold("Макар"), counter.hold("Иван"):
        held = (counter.open_streams("Макар"), counter.open_streams("Иван"))

    assert held == (1, 1)


def test_idle_timeout_passes_a_flowing_stream_through() -> None:
    async def flowing() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    async def scenario() -> list[int]:
        return [m async for m in with_idle_timeout(flowing(), 5.0, what="update")]

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_idle_timeout_ends_a_stalled_stream_with_deadline_exceeded() -> None:
    async def stalls_after_header() -> AsyncIterator[str]:
        yield "header"
        await asyncio.Event().wait()
        yield "never"

    async def scenario() -> list[str]:
        got = []
        with pytest.raises(StreamIdleError, match=r"no update message for 0\.05 s") as info:
            async for m in with_idle_timeout(stalls_after_header(), 0.05, what="update"):
                got.append(m)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        return got

    assert asyncio.run(scenario()) == ["header"]


@pytest.mark.parametrize(
    "bad",
    [
        {"max_streams_per_participant": 0},
        {"push_burst": 0},
        {"push_rate_per_s": 0.0},
        {"stream_idle_timeout_s": -1.0},
    ],
)
def test_limits_config_refuses_nonsense_naming_the_field(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        LimitsConfig(**bad)


class _LimitedPush(pb_grpc.FederationServicer):
    """PushUpdate guarded the way the server's servicer is meant to use the limits."""

    def __init__(self, *, max_streams: int, burst: int, idle_timeout_s: float) -> None:
        self.streams = StreamCounter(max_per_participant=max_streams)
        self.rate = RateLimiter(rate_per_s=0.001, burst=burst)
        self.idle_timeout_s = idle_timeout_s
        self.entered = asyncio.Event()

    async def PushUpdate(self, request_iterator: Any, context: Any) -> pb.PushReply:
        pid = id_from_metadata(context.invocation_metadata()) or ""
        try:
            with self.streams.hold(pid):
                self.entered.set()
                chunks = with_idle_timeout(request_iterator, self.idle_timeout_s, what="update")
                count = sum([1 async for _ in chunks])
                self.rate.acquire(pid)
        except LimitError as exc:
            await context.abort(exc.code, str(exc))
        return pb.PushReply(sequence=count)


async def _header_then(stall: asyncio.Event | None) -> AsyncIterator[pb.UpdateChunk]:
    yield pb.UpdateChunk(header=pb.UpdateHeader(session="s", participant_id="Макар"))
    if stall is not None:
        await stall.wait()


async def _push_outcomes(
    servicer: _LimitedPush, *, concurrent_stalled: bool, pushes: int, stall_all: bool = False
) -> list[str]:
    """Run pushes against a real server; each outcome is "ok" or the status name and details."""
    server = grpc.aio.server()
    pb_grpc.add_FederationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    metadata = (id_to_metadata("Макар"),)
    outcomes = []
    release = asyncio.Event()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
            held = None
            if concurrent_stalled:
                held = stub.PushUpdate(_header_then(release), metadata=metadata, timeout=30)
                await servicer.entered.wait()
            for _ in range(pushes):
                stall = release if stall_all else None
                try:
                    await stub.PushUpdate(_header_then(stall), metadata=metadata, timeout=30)
                    outcomes.append("ok")
                except grpc.aio.AioRpcError as exc:
                    outcomes.append(f"{exc.code().name}: {exc.details()}")
            if held is not None:
                held.cancel()
    finally:
        release.set()
        await server.stop(None)
    return outcomes


def test_stream_past_the_limit_is_resource_exhausted_over_grpc() -> None:
    servicer = _LimitedPush(max_streams=1, burst=10, idle_timeout_s=30.0)

    outcomes = asyncio.run(_push_outcomes(servicer, concurrent_stalled=True, pushes=1))

    assert outcomes[0].startswith("RESOURCE_EXHAUSTED: concurrent stream limit")


def test_pushes_past_the_rate_are_resource_exhausted_over_grpc() -> None:
    servicer = _LimitedPush(max_streams=4, burst=2, idle_timeout_s=30.0)

    outcomes = asyncio.run(_push_outcomes(servicer, concurrent_stalled=False, pushes=3))

    assert outcomes[:2] == ["ok", "ok"]
    assert outcomes[2].startswith("RESOURCE_EXHAUSTED: push rate limit")


def test_stalled_upload_is_deadline_exceeded_over_grpc() -> None:
    servicer = _LimitedPush(max_streams=4, burst=2, idle_timeout_s=0.2)

    outcomes = asyncio.run(
        _push_outcomes(servicer, concurrent_stalled=False, pushes=1, stall_all=True)
    )

    assert outcomes[0].startswith("DEADLINE_EXCEEDED: stream idle timeout")
