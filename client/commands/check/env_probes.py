"""The check's env probes: stepping and actor inference at a few widths, then actor processes.

Each measurement runs the real code: the vector env the engine steps, the
network its actors act with, and actor processes spawned as the engine
spawns them, all one thread each.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch

from fedrl.client.commands.check.config import Algorithm
from fedrl.client.commands.check.progress import CheckProgress, timed
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.policy_network import ActorCritic, build_actor_critic
from fedrl.client.training.q_network import build_q_network
from fedrl.client.training.vector_env import EnvShape, env_shape, make_vector_env

START_TIMEOUT_S = 120.0
"""How long the probe waits for one more actor process to become ready."""


class ProbeError(RuntimeError):
    """A part of the probe could not run; the check reports it and goes on without it."""


@dataclass(frozen=True)
class WidthProbe:
    envs: int
    env_steps_per_s: float
    """Env steps/s of stepping alone, random actions."""
    inference_us: float
    """Microseconds of one Q-network forward pass at this batch width."""
    actor_steps_per_s: float
    """Env steps/s of an actor: stepping plus one inference per vector step."""


def _actor_network(algo: Algorithm, shape: EnvShape, hidden: tuple[int, ...]) -> torch.nn.Module:
    """The network an actor of `algo` runs: the Q-network or the actor-critic."""
    if algo == "ppo":
        return build_actor_critic(
            shape.obs_shape, shape, hidden=hidden, network=NetworkConfig()
        ).eval()
    return build_q_network(shape.obs_shape, shape.n_actions, hidden=hidden, dueling=True).eval()


def _act(net: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        if isinstance(net, ActorCritic):
            params, _ = net(obs)  # the value comes with every action: PPO records it
            return net.sample(params)
        action: torch.Tensor = net(obs).argmax(dim=1)
        return action


def probe_widths(
    env_id: str,
    hidden: tuple[int, ...],
    widths: Sequence[int],
    seconds: float,
    *,
    algo: Algorithm = "dqn",
    progress: CheckProgress | None = None,
) -> list[WidthProbe]:
    """Env stepping and actor inference at each batch width, in this process, one thread."""
    progress = progress or CheckProgress()
    out = []
    for width in widths:
        setting = f"{width} envs"
        progress.begin("env stepping", setting)
        env = make_vector_env(env_id, width)
        try:
            shape = env_shape(env, continuous=algo == "ppo")
            env.reset(seed=0)
            env.action_space.seed(0)
            actions = [env.action_space.sample() for _ in range(8)]

            def step(env: Any = env, actions: list[Any] = actions) -> int:
                for action in actions:
                    env.step(action)
                return len(actions) * int(env.num_envs)

            env_rate = timed(step, seconds, progress)
        finally:
            env.close()
        progress.end(f"{env_rate:,.0f} steps/s")
        progress.begin("inference", setting)
        net = _actor_network(algo, shape, hidden)
        obs = torch.zeros((width, *shape.obs_shape))

        def infer(net: torch.nn.Module = net, obs: torch.Tensor = obs) -> int:
            for _ in range(8):
                _act(net, obs)
            return 8

        calls_per_s = timed(infer, seconds, progress)
        inference_s = 1.0 / calls_per_s
        progress.end(f"{inference_s * 1e6:,.0f} µs")
        actor_rate = width / (width / env_rate + inference_s)
        out.append(WidthProbe(width, env_rate, inference_s * 1e6, actor_rate))
    return out


def _actor_worker(
    env_id: str, width: int, hidden: tuple[int, ...], conn: Connection, algo: Algorithm = "dqn"
) -> None:
    """One parallel actor for the probe: steps and infers for as long as it is told to."""
    torch.set_num_threads(1)  # as the engine's actors do
    env = make_vector_env(env_id, width)
    shape = env_shape(env, continuous=algo == "ppo")
    net = _actor_network(algo, shape, hidden)
    obs, _ = env.reset(seed=os.getpid())
    conn.send("ready")
    try:
        while (seconds := conn.recv()) is not None:
            steps, end = 0, time.perf_counter() + float(seconds)
            while time.perf_counter() < end:
                action = _act(net, torch.from_numpy(np.asarray(obs, np.float32)))
                obs, *_ = env.step(action.numpy())
                steps += width
            conn.send(steps / float(seconds))
    finally:
        env.close()
        conn.close()


def probe_workers(
    env_id: str,
    hidden: tuple[int, ...],
    width: int,
    counts: Sequence[int],
    seconds: float,
    *,
    algo: Algorithm = "dqn",
    progress: CheckProgress | None = None,
) -> dict[int, float]:
    """Aggregate env steps/s with each count of actor processes running at once.

    The processes start once (spawned, like the engine's actors) and are
    reused for every count, so the probe pays their start-up only once.
    """
    if not counts:
        return {}
    progress = progress or CheckProgress()
    progress.begin("actor processes", f"starting {max(counts)}")
    ctx = mp.get_context("spawn")
    pipes: list[Connection] = []
    processes = []
    try:
        for _ in range(max(counts)):
            parent, child = ctx.Pipe()
            process = ctx.Process(
                target=_actor_worker, args=(env_id, width, hidden, child, algo), daemon=True
            )
            process.start()
            child.close()
            pipes.append(parent)
            processes.append(process)
        _await_ready(pipes, progress)
        progress.end(f"{len(pipes)} ready")
        rates: dict[int, float] = {}
        for count in counts:
            progress.begin("actor processes", f"{count} at once")
            for pipe in pipes[:count]:
                pipe.send(seconds)
            progress.status(f"measuring {seconds:.1f} s")
            rates[count] = sum(float(pipe.recv()) for pipe in pipes[:count])
            progress.end(f"{rates[count]:,.0f} steps/s")
        return rates
    except (EOFError, OSError) as exc:
        codes = [p.exitcode for p in processes if p.exitcode is not None]
        raise ProbeError(
            f"a probe actor process died (exit codes {codes}); its error is printed above"
        ) from exc
    finally:
        for pipe in pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
            pipe.close()
        for process in processes:
            process.join(timeout=10.0)
            if process.is_alive():
                process.kill()
                process.join()


def _await_ready(pipes: Sequence[Connection], progress: CheckProgress) -> None:
    """Wait until every probe actor says it is ready, showing how many are; ProbeError when
    none more gets ready for START_TIMEOUT_S (an import that hangs, a machine out of memory)."""
    waiting = list(pipes)
    last_ready = time.monotonic()
    while waiting:
        for pipe in wait(waiting, timeout=0.25):
            assert isinstance(pipe, Connection)
            if pipe.recv() != "ready":
                raise ProbeError("a probe actor process sent something else than ready")
            waiting.remove(pipe)
            last_ready = time.monotonic()
        if waiting and time.monotonic() - last_ready > START_TIMEOUT_S:
            raise ProbeError(
                f"{len(waiting)} probe actor process(es) did not start within "
                f"{START_TIMEOUT_S:.0f} s"
            )
        progress.status(f"{len(pipes) - len(waiting)} of {len(pipes)} ready")
