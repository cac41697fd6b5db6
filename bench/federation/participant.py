"""One participant process: a TrainingEngine in serial mode, alone or with the client's SyncLoop.

The runner starts it as `python -m bench.federation.participant TASK_JSON`;
it says "ready", waits for "go" on stdin so that no participant gets a head
start, trains to its budget noting the wall clock, CPU seconds, env steps and
updates at every mark, and writes a ParticipantReport as JSON.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from bench.federation.settings import (
    SERVERLESS_MODES,
    SESSION,
    SHARE,
    Algorithm,
    Configuration,
    Mode,
    Settings,
    learner_overrides,
    settings_from_json,
)
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.policy_network import ppo_architecture_name
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.q_network import architecture_name

Weights = list[tuple[str, np.ndarray]]
DEFAULT_REPLAY_RATIO = EngineConfig().replay_ratio
"""The engine's replay ratio where a configuration sets none."""


@dataclass(frozen=True)
class ParticipantTask:
    """Everything one participant process needs, passed as JSON on its command line."""

    index: int
    participant_id: str
    address: str
    """The server's host:port; "" without a server."""
    state_dir: str
    result_path: str
    seed: int
    mode: Mode
    settings: Settings
    algo: Algorithm = "dqn"
    replay_ratio: float | None = None
    """The engine's replay ratio; None: its default."""
    learns: bool = True
    """False: an actor of mode "roles" (TrainingEngine(learn=False))."""
    save_local: bool = False
    """Write the local weights at every mark (participant 0, scored as its own model)."""
    pace_post: str = ""
    """The file where this participant posts its env steps for others to keep pace with ("":
    nobody follows it)."""
    pace_follow: tuple[str, ...] = ()
    """The files of the participants it never steps past: in "roles" an actor follows the
    learner; with `even_pace` every participant follows all the others."""


@dataclass(frozen=True)
class ParticipantReport:
    """What one participant did and spent, as its process wrote it at the end."""

    learns: bool
    env_steps: int
    episodes: int
    updates: int
    foreign_received: int
    """Other participants' transitions taken into its replay."""
    cpu_seconds: float
    """User + system CPU of its process from "go" to its end (network thread included)."""
    mark_ms: list[int]
    """Wall time (unix ms) at which it reached each mark."""
    mark_cpu: list[float]
    """Its CPU seconds since "go" at each mark."""
    mark_steps: list[int]
    """Its env steps when it noted each mark (a mark is passed inside a batch of steps)."""
    mark_updates: list[int]
    """Its gradient updates when it noted each mark."""
    throttled: int = 0
    """Pushes the server refused by its rate limit (retried later), from its log."""


def task_from_json(raw: dict[str, Any]) -> ParticipantTask:
    """A ParticipantTask as the runner wrote it (JSON turned its tuples into lists)."""
    return ParticipantTask(
        **{
            **raw,
            "settings": settings_from_json(raw["settings"]),
            "pace_follow": tuple(raw["pace_follow"]),
        }
    )


def engine_configs(
    settings: Settings, seed: int, algo: Algorithm = "dqn", replay_ratio: float | None = None
) -> tuple[EngineConfig, LearnerConfig | PPOConfig]:
    """Serial mode, no local evaluation: the bench scores the models itself."""
    engine = EngineConfig(
        env=settings.env,
        workers=0,
        envs_per_worker=settings.envs_per_participant,
        eval_interval=0,
        seed=seed,
    )
    if replay_ratio is not None:
        engine = replace(engine, replay_ratio=replay_ratio)
    return engine, learner_config(settings, algo)


def learner_config(settings: Settings, algo: Algorithm) -> LearnerConfig | PPOConfig:
    """The learner's defaults on the CPU, as --learner changes them; PPO's are its own.

    A pooled DQN learner gets the target period a member of its N gets: a member
    takes in N participants' transitions per own env step and its learner
    lengthens the period by that multiple to the data exponent; the pooled
    learner's multiple is 1 (all its data is its own), so without this it would
    keep a lone learner's period while making N times the updates per mark.
    """
    if algo == "ppo":
        return PPOConfig(device="cpu")
    learner = learner_overrides(
        LearnerConfig(hidden=settings.hidden, device="cpu"), settings.learner
    )
    scale = settings.pooled_over**learner.target_period_data_exponent
    return replace(
        learner, target_update_interval=max(1, round(learner.target_update_interval * scale))
    )


def learning_starts(settings: Settings) -> int:
    """Transitions in a DQN learner's replay before its first update, as --learner sets it."""
    learner = learner_config(settings, "dqn")
    assert isinstance(learner, LearnerConfig)
    return learner.learning_starts


def architecture(learner: LearnerConfig | PPOConfig) -> str:
    """The model spec's algorithm name, as the client gives it."""
    if isinstance(learner, PPOConfig):
        return ppo_architecture_name(learner.ppo_hidden, NetworkConfig())
    return architecture_name(learner.hidden, learner.dueling)


def participant_seed(seed: int, index: int) -> int:
    """Distinct, reproducible seed streams per (run seed, participant)."""
    return seed * 1_000 + index


def initial_weights(settings: Settings, seed: int, algo: Algorithm) -> Weights:
    """The network every participant of a run starts from: version 0 of the federated runs."""
    engine_config, learner = engine_configs(settings, seed, algo)
    engine = TrainingEngine(engine_config, learner)
    try:
        return engine.weights()
    finally:
        engine.close()


def cpu_seconds() -> float:
    """User + system CPU of this process so far, every thread included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def die_with_parent() -> None:
    """SIGKILL this process when the bench that started it dies (Linux only)."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)


class StepPace:
    """One participant's env steps in a file, so that others keep its pace.

    Ape-X's actors play in real time while its learner trains; here an actor
    that trains nothing would play its whole budget in a second while the
    learner is still warming up, and per-participant env steps would say
    nothing about roles. Paced, every participant takes its steps at the
    learner's rate, as in the other modes, where each one trains. With
    `even_pace` every participant keeps everyone's (paced_by).
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._scratch = path.with_suffix(".tmp")

    def post(self, env_steps: int) -> None:
        """The followed participant's side: its env steps so far (replaced atomically)."""
        self._scratch.write_text(str(env_steps), encoding="utf-8")
        os.replace(self._scratch, self._path)

    def wait_until_behind(self, env_steps: int, *, poll_s: float = 0.002) -> None:
        """A follower's side: return once the followed one has taken at least `env_steps`."""
        while True:
            try:
                posted = int(self._path.read_text(encoding="utf-8"))
            except (FileNotFoundError, ValueError):
                posted = -1
            if posted >= env_steps:
                return
            time.sleep(poll_s)


def paced_by(configuration: Configuration, settings: Settings, index: int) -> list[int]:
    """The participants whose env steps participant `index` never runs ahead of."""
    if configuration.mode == "roles" and index > 0:
        return [0]
    if settings.even_pace:
        return [other for other in range(configuration.processes) if other != index]
    return []


def run_participant(task: ParticipantTask) -> None:
    """Train to the budget (alongside the others, if any); write marks and costs as JSON."""
    torch.set_num_threads(1)
    settings = task.settings
    state_dir = Path(task.state_dir)
    engine_config, learner = engine_configs(
        settings, participant_seed(task.seed, task.index), task.algo, task.replay_ratio
    )
    # Every participant starts from version 0: no first push carries progress
    # made on another initialisation, and a lone learner starts where the
    # federated runs do (its version 0 made before its own engine, which is
    # then built exactly as federated participant 0's).
    initial = (
        initial_weights(settings, task.seed, task.algo) if task.mode in SERVERLESS_MODES else None
    )
    engine = TrainingEngine(engine_config, learner, learn=task.learns)
    loop: SyncLoop | None = None
    try:
        if initial is not None:
            engine.set_weights(initial)
        else:
            engine.set_weights(_pull_initial_model(task, engine))
            loop = _sync_loop(task, engine, state_dir)
            loop.start(connect_timeout_s=30.0)
        engine.start()
        # Ready; wait for the common start so that no participant gets a head start.
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("participant: the bench did not say go")
        cpu_at_go = cpu_seconds()
        mark_ms: list[int] = []
        mark_cpu: list[float] = []
        mark_steps: list[int] = []
        mark_updates: list[int] = []
        marks = iter(settings.marks)
        next_mark = next(marks, None)
        posted = StepPace(Path(task.pace_post)) if task.pace_post else None
        followed = [StepPace(Path(path)) for path in task.pace_follow]
        while engine.counters.env_steps < settings.budget_steps:
            if posted is not None:
                posted.post(engine.counters.env_steps)
            for pace in followed:
                pace.wait_until_behind(engine.counters.env_steps)
            result = engine.poll()
            if loop is not None:
                loop.after_poll(result)
            while next_mark is not None and engine.counters.env_steps >= next_mark:
                mark_ms.append(int(time.time() * 1000))
                mark_cpu.append(cpu_seconds() - cpu_at_go)
                mark_steps.append(engine.counters.env_steps)
                mark_updates.append(engine.counters.updates)
                if task.save_local:
                    save_weights(state_dir / "local" / f"{next_mark}.npz", engine.weights())
                next_mark = next(marks, None)
        if posted is not None:
            posted.post(engine.counters.env_steps)
        if loop is not None:
            loop.finish(flush_timeout_s=60.0)
        spent = cpu_seconds() - cpu_at_go
    finally:
        if loop is not None:
            loop.close()
        engine.close()
    counters = engine.counters
    report = ParticipantReport(
        learns=task.learns,
        env_steps=counters.env_steps,
        episodes=counters.episodes,
        updates=counters.updates,
        foreign_received=engine.foreign_received,
        cpu_seconds=spent,
        mark_ms=mark_ms,
        mark_cpu=mark_cpu,
        mark_steps=mark_steps,
        mark_updates=mark_updates,
    )
    Path(task.result_path).write_text(json.dumps(asdict(report)), encoding="utf-8")


def _sync_loop(task: ParticipantTask, engine: TrainingEngine, state_dir: Path) -> SyncLoop:
    settings = task.settings
    share = SHARE[task.mode]
    return SyncLoop(
        engine,
        state_dir=state_dir / "sync",
        participant_id=task.participant_id,
        session=SESSION,
        spec=model_spec(settings.env, engine.weights(), architecture(engine.learner.config)),
        channel_factory=lambda: grpc.aio.insecure_channel(task.address),
        share=share,
        plan=settings.sync_plan(share, on_policy=engine.on_policy),
        evaluate_global=False,
        exchange=ExchangeConfig(
            foreign_credit=settings.foreign_credit,
            round_foreign_credit=settings.round_foreign_credit,
            pull_transitions=settings.pull_transitions,
            credit_at_own_pace=settings.credit_at_own_pace,
        ),
        target_at_adoption=settings.target_at_adoption,
    )


def _pull_initial_model(task: ParticipantTask, engine: TrainingEngine) -> Weights:
    spec = model_spec(task.settings.env, engine.weights(), architecture(engine.learner.config))

    async def pull() -> Weights:
        async with grpc.aio.insecure_channel(task.address) as channel:
            client = FederationClient(channel, participant_id=task.participant_id, session=SESSION)
            await client.join(spec)
            return (await client.pull_model(version=0)).tensors

    return asyncio.run(pull())


def save_weights(path: Path, weights: Sequence[tuple[str, np.ndarray]]) -> None:
    """Named tensors in an .npz: the names as the first array, then the tensors in order, so
    np.load reads them back without pickle, whatever characters the names hold."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, np.array([name for name, _ in weights]), *(array for _, array in weights))


def load_weights(path: Path) -> Weights:
    """What save_weights wrote."""
    with np.load(path, allow_pickle=False) as archive:
        names = [str(n) for n in archive["arr_0"]]
        return [(name, np.array(archive[f"arr_{i + 1}"])) for i, name in enumerate(names)]


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        raise SystemExit("usage: python -m bench.federation.participant TASK_JSON (the runner's)")
    die_with_parent()
    logging.basicConfig(level=logging.WARNING)
    run_participant(task_from_json(json.loads(args[0])))


if __name__ == "__main__":
    main()
