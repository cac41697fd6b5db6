"""Two learner ranks on gloo, each a spawned process reporting what it saw through a queue."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any

from tests.support.ports import free_port

RankMain = Callable[[int, int, "Queue[Any]"], None]
"""(rank, port, results): runs one rank and puts (rank, *what it saw) on results."""


def run_two_ranks(rank_main: RankMain, *, timeout_s: float) -> dict[int, Any]:
    """What each of two ranks put on the queue, by rank; both must exit cleanly.

    `rank_main` must be a module-level function: the ranks are spawned.
    """
    ctx = mp.get_context("spawn")
    results: Queue[Any] = ctx.Queue()
    port = free_port()
    ranks = [ctx.Process(target=rank_main, args=(rank, port, results)) for rank in range(2)]
    for process in ranks:
        process.start()
    try:
        got = {}
        for _ in ranks:
            item = results.get(timeout=timeout_s)
            got[item[0]] = item[1:]
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert [p.exitcode for p in ranks] == [0, 0]
    return got
