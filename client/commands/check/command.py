"""`fedrl-client check`: this machine, the server's reachability, and settings to train with.

The recommendation comes from a short measured probe with the real code, not
from a table: the vector env and Q-network inference at a few batch widths
(envs per actor), actor processes at a few counts running in parallel, and
the learner's update at a few batch sizes on each device. It reads and
measures only; it writes no file and changes no setting.

The check runs in steps (fedrl.client.commands.check): facts about the
machine, the server, env and learner probes, a recommendation from their
figures, and the report; its progress shows on stderr as it goes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import asdict

import click
import torch

from fedrl.client.commands.check.config import (
    BATCH_SIZES,
    ENV_WIDTHS,
    MINIBATCH_SIZES,
    QUICK_BATCH_SIZES,
    QUICK_ENV_WIDTHS,
    QUICK_MINIBATCH_SIZES,
    CheckConfig,
)
from fedrl.client.commands.check.env_probes import ProbeError, probe_widths, probe_workers
from fedrl.client.commands.check.facts import machine_facts
from fedrl.client.commands.check.learner_probes import probe_ppo_updates, probe_updates
from fedrl.client.commands.check.progress import CheckProgress, check_reporter
from fedrl.client.commands.check.recommendation import (
    knee,
    recommend,
    recommend_ppo,
    with_capacity,
)
from fedrl.client.commands.check.report import Report, render
from fedrl.client.commands.check.server_probe import check_server
from fedrl.client.commands.game_defaults import GAME_ENGINE
from fedrl.client.training.cnn import is_image
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.vector_env import env_shape, make_vector_env
from fedrl.common.config_cli import takes_config
from fedrl.envs.atari import is_atari


def run_check(config: CheckConfig, *, progress: CheckProgress | None = None) -> Report:
    """Facts, the server check and the probe; `progress` hears what is measured, as it is."""
    progress = progress or CheckProgress()
    start = time.perf_counter()
    progress.begin("machine")
    machine = machine_facts()
    progress.end(f"{machine.cores_usable} cores, {len(machine.gpus)} GPUs")
    ppo = config.algo == "ppo"
    widths_at = QUICK_ENV_WIDTHS if config.quick else ENV_WIDTHS
    if ppo:
        sizes = QUICK_MINIBATCH_SIZES if config.quick else MINIBATCH_SIZES
    else:
        sizes = QUICK_BATCH_SIZES if config.quick else BATCH_SIZES
    devices = ["cpu"] + (["cuda"] if machine.gpus else [])
    cores = machine.cores_usable
    counts = _worker_counts(cores - 1, quick=config.quick)
    progress.plan(
        1
        + bool(config.server)
        + 2 * len(widths_at)
        + len(devices) * len(sizes)
        + (1 + len(counts) if counts else 0)
    )
    server = None
    if config.server:
        progress.begin("server", config.server)
        server = check_server(
            config.server,
            ca_cert=config.tls.ca_cert,
            insecure=config.tls.insecure,
            bundle=config.tls.read_bundle(),
        )
        progress.end(server.service if server.reachable else "unreachable")
    hidden = (
        PPOConfig().ppo_hidden if ppo and config.hidden == CheckConfig.hidden else config.hidden
    )
    probe = make_vector_env(config.env, 1)
    try:
        shape = env_shape(probe, continuous=ppo)
    finally:
        probe.close()
    seconds = config.probe_s
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # actors and the default learner run one thread each
    try:
        widths = probe_widths(
            config.env, hidden, widths_at, seconds, algo=config.algo, progress=progress
        )
        if ppo:
            updates = [
                probe
                for device in devices
                for probe in probe_ppo_updates(
                    shape=shape,
                    hidden=hidden,
                    device=device,
                    minibatch_sizes=sizes,
                    seconds=seconds,
                    progress=progress,
                )
            ]
        else:
            updates = [
                probe
                for device in devices
                for probe in probe_updates(
                    obs_shape=shape.obs_shape,
                    n_actions=shape.n_actions,
                    hidden=hidden,
                    device=device,
                    batch_sizes=sizes,
                    seconds=seconds,
                    progress=progress,
                )
            ]
    finally:
        torch.set_num_threads(threads)
    width = knee({p.envs: p.actor_steps_per_s for p in widths})
    problems: list[str] = []
    workers: dict[int, float] = {}
    if counts:
        try:
            workers = probe_workers(
                config.env, hidden, width, counts, 3 * seconds, algo=config.algo, progress=progress
            )
        except ProbeError as exc:
            problems.append(f"parallel actor probe: {exc}; workers recommended without it")
    game = is_atari(config.env)
    if ppo:
        recommendation = recommend_ppo(cores, widths, workers, updates)
    else:
        ratio = GAME_ENGINE["replay_ratio"] if game else EngineConfig().replay_ratio
        recommendation = recommend(cores, widths, workers, updates, replay_ratio=ratio)
        if is_image(shape.obs_shape):
            recommendation = with_capacity(recommendation, shape.obs_shape)
    recommendation = dataclasses.replace(recommendation, env=config.env)
    return Report(
        machine=machine,
        server=server,
        widths=tuple(widths),
        workers=workers,
        updates=tuple(updates),
        recommendation=recommendation,
        probe_seconds=time.perf_counter() - start,
        problems=tuple(problems),
    )


def _worker_counts(most: int, *, quick: bool) -> list[int]:
    """Actor counts to measure in parallel; none in quick mode (spawning costs seconds)."""
    if most < 1 or quick:
        return []
    return sorted({1, max(1, most // 2), most})


@click.command("check")
@takes_config(CheckConfig)
def check_command(config: CheckConfig) -> None:
    """Report this machine and the server, and recommend settings from a short measured probe."""
    try:
        with check_reporter() as reporter:
            report = run_check(config, progress=CheckProgress(reporter))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if config.as_json:
        click.echo(json.dumps(asdict(report), ensure_ascii=False, default=str))
    else:
        click.echo(render(report))
    if report.server is not None and report.server.problems:
        sys.exit(1)
