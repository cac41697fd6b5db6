"""`--learners N` and torchrun: one participant's training as N data-parallel learner ranks.

Both launches end in `run_rank`: torchrun starts N copies of `fedrl-client`,
each with its place in the environment (RANK, WORLD_SIZE, ...), and each
copy's command calls `run_rank` directly; `fedrl-client --learners N` starts
N processes itself, gives each the variables torchrun would, and they call
the same `run_rank`. So the ranks behave the same however they were started.

In a rank: rank 0 trains as a lone participant would (it resumes, saves,
logs, evaluates and federates) with the other ranks' actors and gradients
added through fedrl.client.training.distributed; every other rank follows
(`follow`): it trains its shard and stops when rank 0 does.

The launcher here also supervises: when a rank dies, the others stop (rank 0
first saves the run's state, which resumes with any number of learners) and
the command fails naming the rank and how it died.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

import click
import numpy as np

from fedrl.client.commands.config import TrainConfig
from fedrl.client.training.actor_pool import describe_exit
from fedrl.client.training.distributed import RankFailureError, RankGroup, RankPlace, rank_device
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import available_cores

Train = Callable[[TrainConfig, RankGroup], object]
SignalHandlers = dict[int, Any]
"""Signal handlers as signal.signal returned them, to put back."""
"""The training command as rank 0 runs it (fedrl.client.commands.cli.train)."""

FAILURE_GRACE_S = 60.0
"""How long the other ranks get to stop on their own after one died: rank 0
saves the whole run's state in that time (a checkpoint takes seconds)."""


def per_rank_workers(cores: int, local_ranks: int) -> int:
    """Actor processes per rank by default: each rank's learner keeps one of its share of cores."""
    return max(0, cores // local_ranks - 1)


def with_default_workers(config: TrainConfig, local_ranks: int) -> TrainConfig:
    """`config` with --workers split among the ranks of this machine (for when it was not given)."""
    workers = per_rank_workers(available_cores(), local_ranks)
    return dataclasses.replace(config, engine=dataclasses.replace(config.engine, workers=workers))


def rank_config(config: TrainConfig, place: RankPlace) -> TrainConfig:
    """One rank's config: its device, and seed streams of its own (rank 0 keeps --seed's)."""
    seed = config.engine.seed
    if place.rank:
        seed = int(np.random.SeedSequence(seed, spawn_key=(place.rank,)).generate_state(1)[0])
    device = rank_device(config.learner.device, place)
    return dataclasses.replace(
        config,
        engine=dataclasses.replace(config.engine, seed=seed),
        learner=dataclasses.replace(config.learner, device=device),
    )


def run_rank(config: TrainConfig, place: RankPlace, train: Train) -> None:
    """Join the other ranks and train as rank `place.rank` (rank 0 leads, the rest follow)."""
    if config.learners not in (1, place.world_size):
        raise ValueError(
            f"--learners {config.learners} but this process was launched as one of "
            f"{place.world_size} ranks (WORLD_SIZE); drop --learners under torchrun"
        )
    ranked = rank_config(config, place)
    group = RankGroup(place, ranked.learner.device)
    try:
        if group.leads:
            click.echo(
                f"learner rank 0 of {place.world_size} leads ({group.backend} on "
                f"{group.device}); every rank runs {ranked.engine.workers} actor process(es)",
                err=True,
            )
            train(ranked, group)
        else:
            click.echo(
                f"learner rank {place.rank} of {place.world_size}: pid {os.getpid()}, "
                f"{group.backend} on {group.device}",
                err=True,
            )
            follow(ranked, group)
    finally:
        group.close()


def follow(config: TrainConfig, ranks: RankGroup) -> None:
    """A rank other than 0: train this rank's shard until the ranks agree to stop."""
    engine = TrainingEngine(
        config.engine, config.learner_config, network=config.network, ranks=ranks
    )
    previous = stop_on_signals(engine)
    try:
        engine.start()
        engine.run(lambda _: False)
    finally:
        engine.close()
        restore_signals(previous)


def stop_on_signals(engine: TrainingEngine) -> SignalHandlers:
    """Ctrl-C and SIGTERM ask the ranks to stop at the next round.

    Never an exception in the middle of a collective: one rank leaving a
    collective halfway would leave the others waiting for it.
    """

    def request(signum: int, frame: FrameType | None) -> None:
        engine.request_stop()

    return {signum: signal.signal(signum, request) for signum in (signal.SIGINT, signal.SIGTERM)}


def restore_signals(previous: SignalHandlers) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def launch_learners(config: TrainConfig, train: Train) -> None:
    """Start `config.learners` ranks on this machine, as torchrun would, and wait for them.

    Raises ClickException naming the first rank that failed and how.
    """
    world = config.learners
    port = _free_port()
    ctx = mp.get_context("spawn")
    processes = [
        ctx.Process(
            target=_spawned_rank,
            args=(config, RankPlace(rank, world, rank, world, "127.0.0.1", port), train),
            name=f"fedrl-learner-{rank}",
        )
        for rank in range(world)
    ]
    # Ctrl-C reaches every rank itself (one process group); SIGTERM to this
    # process is passed on, so `kill` stops the ranks as gracefully.
    previous: SignalHandlers = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
        signal.SIGTERM: signal.signal(
            signal.SIGTERM, lambda *_: _signal_all(processes, signal.SIGTERM)
        ),
    }
    try:
        for process in processes:
            process.start()
        failed = _supervise(processes)
    finally:
        restore_signals(previous)
    if failed is not None:
        rank, code = failed
        raise click.ClickException(
            f"learner rank {rank} {describe_exit(code)}, so every rank stopped (the ranks' own "
            f"messages are above); rank 0 keeps the run's state in "
            f"{config.state_dir}: run the same command to resume, with any --learners"
        )


def _spawned_rank(config: TrainConfig, place: RankPlace, train: Train) -> None:
    """A rank process started by launch_learners: torchrun's variables, then run_rank."""
    os.environ.update(place.env())
    try:
        run_rank(config, place, train)
    except (ValueError, RankFailureError, click.ClickException) as exc:
        message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        click.echo(f"learner rank {place.rank}: error: {message}", err=True)
        sys.exit(1)


def _supervise(processes: Sequence[BaseProcess]) -> tuple[int, int] | None:
    """Wait for every rank; the first that exits unsuccessfully, as (rank, exit code)."""
    running = dict(enumerate(processes))
    failed: tuple[int, int] | None = None
    deadline: float | None = None
    while running:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([p.sentinel for p in running.values()], timeout=timeout)
        if not ready:
            # The grace period is over: whoever is left cannot finish without the dead rank.
            for process in running.values():
                process.kill()
            for process in running.values():
                process.join()
            break
        for rank, process in list(running.items()):
            if process.sentinel not in ready:
                continue
            process.join()
            del running[rank]
            code = process.exitcode if process.exitcode is not None else 1
            if code != 0 and failed is None:
                failed = (rank, code)
                deadline = time.monotonic() + FAILURE_GRACE_S
    return failed


def _signal_all(processes: Sequence[BaseProcess], signum: int) -> None:
    for process in processes:
        if process.pid is not None and process.exitcode is None:
            os.kill(process.pid, signum)


def _free_port() -> int:
    """A free loopback port for the ranks' rendezvous (rank 0 listens on it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
