"""The network thread ends with nothing pending: no "Task was destroyed but it is pending!"."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.errors import ServerCallError
from fedrl.client.federation.loop_thread import LoopThread
from fedrl.client.federation.server_link import ServerLink
from fedrl.proto.v1 import tensor_pb2 as tpb
from tests.support.server_harness import InProcessServer, join, make_spec, seed, server_config

DESTROYED = "Task was destroyed but it is pending"


def test_close_settles_a_task_nobody_awaits(caplog: pytest.LogCaptureFixture) -> None:
    # prepare: a task of the kind gRPC starts for a call and nobody holds on to
    loop = LoopThread("test-loop")
    loop.start()

    async def start_hidden() -> asyncio.Task[None]:
        return asyncio.create_task(asyncio.sleep(3600))

    hidden = loop.call(start_hidden())

    # act
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        loop.close()
        del loop
        gc.collect()

    # assert
    assert hidden.cancelled()
    assert DESTROYED not in caplog.text


def test_close_runs_the_last_coroutine_even_when_the_loop_never_started() -> None:
    loop = LoopThread("test-loop")
    ran: list[bool] = []

    async def last() -> None:
        ran.append(True)

    coroutine = last()
    loop.close(coroutine)

    assert ran == []  # never started: closed unawaited, without a "never awaited" warning
    assert coroutine.cr_frame is None


def test_a_link_closed_while_pushes_are_in_flight_leaves_no_task_pending(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # prepare: a session, and a link that pushes a model over and over
    spec = make_spec([(512, 512)])
    weights = [("t0", np.ones((512, 512), np.float32))]
    loops: list[asyncio.AbstractEventLoop] = []
    with InProcessServer(server_config(tmp_path)) as server:
        stub = server.stub()
        join(stub, "a", spec)
        seed(stub, "a", spec, [weights[0][1]])

        def channel() -> grpc.aio.Channel:
            loops.append(asyncio.get_running_loop())
            return grpc.aio.insecure_channel(server.address)

        with caplog.at_level(logging.ERROR, logger="asyncio"):
            # Closes at several moments of a push: one of them cuts a call short.
            for delay_s in (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1):
                link = _pushing_link(channel, spec, weights)
                link.start()
                link.connect()
                link.run_in_background()
                time.sleep(0.1 + delay_s)

                # act
                link.close()
                del link
                gc.collect()

                # assert
                assert not asyncio.all_tasks(loops[-1])
                assert loops[-1].is_closed()
        assert DESTROYED not in caplog.text
        assert "Event loop is closed" not in caplog.text


def _pushing_link(
    channel: Callable[[], grpc.aio.Channel],
    spec: tpb.ModelSpec,
    weights: list[tuple[str, np.ndarray]],
) -> ServerLink:
    """A link whose one task uploads a model over and over (a seeded session refuses each
    upload: what counts is the stream in flight)."""
    link = ServerLink(
        channel_factory=channel,
        participant_id="b",
        session="default",
        spec=spec,
        backoff=BackoffPolicy(base_s=0.1, cap_s=0.5),
    )

    async def push_forever() -> None:
        while True:
            with contextlib.suppress(ServerCallError):
                await link.client.seed_model(weights)

    link.add_task("push", push_forever)
    return link
