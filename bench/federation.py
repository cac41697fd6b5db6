"""Federation pays off: per-participant env steps to a solved global model, for N participants.

A real `fedrl-server` on loopback and N participant processes train one DQN
together. Each participant is this script re-run with `--participant TASK`:
a TrainingEngine in serial mode (`workers=0`: on a small machine every
participant gets the same share of cores, 1 actor = the learner's process)
with the client's SyncLoop, sharing what the mode says: weights ("avg"),
experience ("exchange": the client's `--share experience`, each participant
training its own model) or both.

What is measured is the GLOBAL model. Every participant notes the wall time
at which it crosses each `--eval-every` step mark; after the run the bench
takes, per mark, the median of those times over participants (the moment the
participants have done that many steps each, on the median), finds the newest
global version the server had committed by then (its `created_unix_ms`),
loads that checkpoint from the server's data dir with numpy, and plays
`--eval-episodes` greedy episodes on envs of its own. Evaluation runs after
training, so it takes no CPU from the participants. With experience exchange
only, there is no global model: participant 0's local model is evaluated,
from weights it writes at each mark.

Figures per configuration (N, mode, sync interval, K), over seeds: median
per-participant env steps to a greedy return >= target, median wall clock to
it, the steps speed-up against N = 1 with the same settings (steps_1/steps_N),
for "both" and "exchange" the change in steps against weight averaging alone,
and the mean return over all marks (learning speed below the target too). A seed that
never reaches the target counts as not solved and the median is taken with
it as infinity, so a configuration that mostly fails shows no figure rather
than a flattering one. Wall-clock speed-up is reported only where every
participant had at least one core of its own.

Findings on 2 shared cores (CartPole-v1, 10-12k steps per participant, 2-3
seeds per cell; the tables are in the issue notes): no setting reached the
0.8·N steps speed-up, and groups did not beat one participant in steps per
participant. What was measured and what it taught:
- K: with K > 1 a lone participant's global model trails it by K updates;
  K = 1 in a group applies every member's delta in full, N learners' steps
  add up like an N-times learning rate and the global Q-network diverges at
  N = 4; so the server's default K follows the group (K = N). Server lr 2-4
  with K = N diverged as well.
- The target network at adoption: keeping it instead of resetting it helped a
  lone participant (2 of 2 solved against 0 of 4, sync 10) but slowed a
  pair's early learning threefold (the demo's 400 episodes took 5.7-10.6k env
  steps against 21.6-24.0k: its agents barely learned); reset stays the
  default, keep and shift are options.
- Sync interval: 2 episodes beat 10 (late in a run 10 episodes of 16 envs are
  ~3,000 env steps between versions); one update in flight keeps it cheap.
- Experience: pushing only new transitions removed the duplicates; counting
  foreign transitions toward the replay ratio (at once or paced with local
  steps), and drawing batches in proportion to the foreign data, made
  participants worse (returns stuck at 100-200), which fits the "tandem"
  result (Ostrovski et al. 2021): a DQN learns poorly from data its own
  policy did not choose. A modest fixed share (0.25) is kept.
Averaging N learners is one learner with an N-times batch, not N times the
steps, and adopting the average takes back part of what shared experience
gave: with experience alone participant 0 solved 3 of 3 runs at N = 2 and 4
(median 4,000 steps at N = 2, a 1.5x speed-up; 5 of 6 runs over 6 seeds,
against 3 of 6 alone), the global model 0-2 of 3. More weight on others'
data hurt. Together these cap the speed-up.

Usage:
  .venv/bin/python bench/federation.py --quick
  .venv/bin/python bench/federation.py            # the full sweep (hours on 2 cores)
  .venv/bin/python bench/federation.py --n 1 2 --modes both --sync-intervals 2 --seeds 0
The last line of stdout is one JSON object with every figure; a PNG of
evaluation return against per-participant env steps goes to --plot.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import itertools
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import grpc
import numpy as np
import torch
from matplotlib.figure import Figure

from fedrl.client.federation.experience_sync import ExchangeConfig, mixed_replay
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.sync_loop import Share, SyncLoop
from fedrl.client.training.engine import EngineConfig, TrainingEngine, available_cores
from fedrl.client.training.evaluation import Evaluator
from fedrl.client.training.learner import TARGET_AT_ADOPTION, LearnerConfig, TargetAtAdoption
from fedrl.client.training.mixed_replay import MixedReplay
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.policy_network import ActorCritic, ppo_architecture_name
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.q_network import architecture_name, load_named_arrays
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.launcher import ServerProcess

Mode = Literal["avg", "exchange", "both"]
Algorithm = Literal["dqn", "ppo"]
MODES: tuple[Mode, ...] = ("avg", "exchange", "both")
SHARE: dict[Mode, Share] = {"avg": "weights", "exchange": "experience", "both": "both"}
"""What each mode has the client share (SyncLoop's `share`, the client's --share)."""
MODE_NAMES = {
    "avg": "weight averaging",
    "exchange": "experience only (p0 local model)",
    "both": "both",
}
CARTPOLE_TARGET = 475.0
SESSION = "default"


# Configuration.


@dataclass(frozen=True)
class Settings:
    """What every run of one bench invocation shares."""

    env: str = "CartPole-v1"
    """Gymnasium env id of the task."""
    target: float = CARTPOLE_TARGET
    """Greedy evaluation return that counts as solved."""
    budget_steps: int = 20_000
    """Env steps each participant takes; the run ends when all have."""
    eval_every: int = 500
    """Per-participant env steps between evaluation marks."""
    eval_episodes: int = 10
    """Greedy episodes per evaluation, played at once."""
    envs_per_participant: int = 16
    """Envs each participant's serial actor steps as one batch (the engine's default)."""
    hidden: tuple[int, ...] = (256, 256)
    """Q-network hidden widths (the learner's default)."""
    server_lr: float = 1.0
    """Server learning rate (ServerConfig.server_lr)."""
    staleness_exponent: float = 0.5
    """Staleness weight (1 + s) ** -exponent (ServerConfig.staleness_exponent)."""
    max_staleness: int = 16
    """Oldest accepted base version, in versions behind (ServerConfig.max_staleness)."""
    buffer_timeout_s: float = 5.0
    """A non-empty buffer becomes a version after this long (ServerConfig.buffer_timeout_s)."""
    foreign_share: float = 0.25
    """Share of each training batch drawn from foreign transitions (ExchangeConfig)."""
    delta_dtype: str = "bfloat16"
    """Wire dtype of weight deltas (SyncLoop.delta_dtype)."""
    target_at_adoption: TargetAtAdoption = "shift"
    """Target network when a global model is adopted: "reset" to it (the client's
    default), "keep" as it was, or "shift" by the same change as the online net."""


@dataclass(frozen=True)
class Configuration:
    """One cell of the sweep; run once per seed."""

    n: int
    """Participants."""
    mode: Mode
    """What they share: weights ("avg"), experience ("exchange") or both."""
    sync_interval: int
    """Local episodes between syncs."""
    buffer_size: int
    """Updates buffered into one global version (K)."""
    algo: Algorithm = "dqn"
    """The client's algorithm: PPO pushes after every rollout update (sync_interval unused)
    and shares weights only (experience is off-policy data)."""

    @property
    def key(self) -> str:
        sync = "per update" if self.algo == "ppo" else self.sync_interval
        return f"{self.algo} N={self.n} {self.mode} sync={sync} K={_k(self.buffer_size)}"

    @property
    def baseline(self) -> Configuration:
        """The same settings with one participant: what the speed-up is measured against."""
        return replace(self, n=1)


RECOMMENDED = Configuration(n=1, mode="both", sync_interval=2, buffer_size=0)
"""The settings to run with (N varies): the client's and server's defaults (both weights and
experience, sync every 10 episodes, automatic K)."""


@dataclass(frozen=True)
class ParticipantTask:
    """Everything one participant process needs, passed as JSON on its command line."""

    index: int
    participant_id: str
    address: str
    state_dir: str
    result_path: str
    seed: int
    mode: Mode
    sync_interval: int
    settings: Settings
    algo: Algorithm = "dqn"
    save_local_every_mark: bool = False
    """Write the local weights at every mark (experience-only runs: no global model)."""


@dataclass(frozen=True)
class RunResult:
    """One seed of one configuration: the evaluation curve and when the target was met."""

    configuration: Configuration
    seed: int
    marks: list[int]
    """Per-participant env steps of each evaluation."""
    returns: list[float | None]
    """Greedy mean return at each mark; None before the first global version existed."""
    seconds: list[float]
    """Wall clock from the common start to each mark (median over participants)."""
    versions: list[int]
    """Global version evaluated at each mark (-1: participant 0's local model)."""
    initial_return: float
    """Greedy mean return of version 0, the model everyone started from."""
    steps_to_target: int | None
    seconds_to_target: float | None
    total_versions: int
    run_seconds: float
    foreign_transitions: int
    """Foreign transitions in participant replays at the end, summed (experience exchange)."""


# The participant process.


def engine_configs(
    settings: Settings, seed: int, algo: Algorithm = "dqn"
) -> tuple[EngineConfig, LearnerConfig | PPOConfig]:
    """Serial mode, no local evaluation: the bench evaluates the global model itself.

    PPO runs with the client's defaults (its hidden widths are its own).
    """
    engine = EngineConfig(
        env=settings.env,
        workers=0,
        envs_per_worker=settings.envs_per_participant,
        eval_interval=0,
        seed=seed,
    )
    if algo == "ppo":
        return engine, PPOConfig(device="cpu")
    return engine, LearnerConfig(hidden=settings.hidden, device="cpu")


def architecture(learner: LearnerConfig | PPOConfig) -> str:
    """The model spec's algorithm name, as the client gives it."""
    if isinstance(learner, PPOConfig):
        return ppo_architecture_name(learner.ppo_hidden, NetworkConfig())
    return architecture_name(learner.hidden, learner.dueling)


def participant_seed(seed: int, index: int) -> int:
    """Distinct, reproducible seed streams per (run seed, participant)."""
    return seed * 1_000 + index


def die_with_parent() -> None:
    """SIGKILL this process when the bench that started it dies (Linux only)."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def run_participant(task: ParticipantTask) -> None:
    """Train to the budget alongside the others; write the mark times as JSON."""
    torch.set_num_threads(1)
    settings = task.settings
    state_dir = Path(task.state_dir)
    engine_config, learner_config = engine_configs(
        settings, participant_seed(task.seed, task.index), task.algo
    )
    exchange = ExchangeConfig(foreign_share=settings.foreign_share)
    engine = TrainingEngine(
        engine_config,
        learner_config,
        replay=(
            (lambda learner, shape: mixed_replay(learner, shape, exchange))
            if task.mode != "avg"
            else None
        ),
    )
    weights = _pull_initial_model(task, engine)
    # Every participant starts from the session's version 0, so no first push
    # carries progress made on another initialisation, and participants that
    # share experience only start where the others do.
    engine.set_weights(weights)
    spec = model_spec(settings.env, weights, architecture(learner_config))
    loop = SyncLoop(
        engine,
        state_dir=state_dir / "sync",
        participant_id=task.participant_id,
        session=SESSION,
        spec=spec,
        channel_factory=lambda: grpc.aio.insecure_channel(task.address),
        share=SHARE[task.mode],
        sync_interval=task.sync_interval,
        delta_dtype=settings.delta_dtype,
        evaluate_global=False,
        exchange=exchange,
        target_at_adoption=settings.target_at_adoption,
    )
    loop.start(connect_timeout_s=30.0)

    engine.start()
    # Ready; wait for the common start so that no participant gets a head start.
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("participant: the bench did not say go")

    marks: dict[int, int] = {}
    next_mark = settings.eval_every
    local_dir = state_dir / "local"
    try:
        while engine.counters.env_steps < settings.budget_steps:
            loop.after_poll(engine.poll())
            steps = engine.counters.env_steps
            while steps >= next_mark and next_mark <= settings.budget_steps:
                marks[next_mark] = int(time.time() * 1000)
                if task.save_local_every_mark:
                    _save_weights(local_dir / f"{next_mark}.npz", engine.weights())
                next_mark += settings.eval_every
        loop.finish(flush_timeout_s=60.0)
    finally:
        loop.close()
        engine.close()
    counters = engine.counters
    replay = engine.learner.replay
    Path(task.result_path).write_text(
        json.dumps(
            {
                "marks": {str(k): v for k, v in marks.items()},
                "env_steps": counters.env_steps,
                "episodes": counters.episodes,
                "updates": counters.updates,
                "foreign_transitions": (
                    len(replay.foreign) if isinstance(replay, MixedReplay) else 0
                ),
            }
        ),
        encoding="utf-8",
    )


def _pull_initial_model(task: ParticipantTask, engine: TrainingEngine) -> list[tuple[str, Any]]:
    spec = model_spec(task.settings.env, engine.weights(), architecture(engine.learner.config))

    async def pull() -> list[tuple[str, Any]]:
        async with grpc.aio.insecure_channel(task.address) as channel:
            client = FederationClient(channel, participant_id=task.participant_id, session=SESSION)
            await client.join(spec)
            return (await client.pull_model(version=0)).tensors

    return asyncio.run(pull())


def _save_weights(path: Path, weights: Sequence[tuple[str, np.ndarray]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # The names as the first array, then the tensors in order: np.load reads
    # it back without pickle, whatever characters the tensor names hold.
    np.savez(path, np.array([name for name, _ in weights]), *(array for _, array in weights))


def _load_weights(path: Path) -> list[tuple[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as archive:
        names = [str(n) for n in archive["arr_0"]]
        return [(name, np.array(archive[f"arr_{i + 1}"])) for i, name in enumerate(names)]


# The server.


class BenchServer(ServerProcess):
    """The run's `fedrl-server serve` child (fedrl.server.launcher) on a free loopback port.

    Like the participants (die_with_parent), it dies with the bench, so an
    interrupted bench leaves nothing behind burning the shared cores.
    """

    def __init__(self, data_dir: Path, configuration: Configuration, settings: Settings) -> None:
        options = {
            "--buffer-size": str(configuration.buffer_size),
            "--max-pending": str(max(32, configuration.buffer_size)),
            "--buffer-timeout-s": str(settings.buffer_timeout_s),
            "--server-lr": str(settings.server_lr),
            "--staleness-exponent": str(settings.staleness_exponent),
            "--max-staleness": str(settings.max_staleness),
            "--sync-interval": str(configuration.sync_interval),
            # Every version stays on disk: the bench evaluates them after the run.
            "--keep-last": "1000000",
            # The run ends by budget, not by goal.
            "--goal-episodes": "100000000",
        }
        # Benchmarks measure training, not the page.
        super().__init__(
            data_dir, *itertools.chain.from_iterable(options.items()), "--no-dashboard"
        )
        self.start()

    def versions(self) -> list[pb.VersionState]:
        """Every committed version, oldest first, with its time and checkpoint file."""
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
            reply = stub.Status(pb.StatusRequest(session=SESSION, max_versions=1_000_000))
        if not reply.sessions:
            return []
        return sorted(reply.sessions[0].versions, key=lambda v: v.version)


def seed_session(address: str, settings: Settings, seed: int, algo: Algorithm) -> None:
    """Version 0: a fresh network from the run's seed, seeded by the bench itself."""
    engine_config, learner_config = engine_configs(settings, seed, algo)
    engine = TrainingEngine(engine_config, learner_config)
    weights = engine.weights()
    engine.close()
    spec = model_spec(settings.env, weights, architecture(learner_config))

    async def seed_it() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            client = FederationClient(channel, participant_id="bench", session=SESSION)
            await client.join(spec)
            await client.seed_model(weights)

    asyncio.run(seed_it())


# One run.


class Participant:
    """This script as a child process in participant mode."""

    def __init__(self, task: ParticipantTask, log_path: Path) -> None:
        self.task = task
        self.log_path = log_path
        self._log = log_path.open("w", encoding="utf-8")
        task_json = json.dumps(asdict(task))
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--participant", task_json],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def wait_ready(self, timeout_s: float) -> None:
        assert self.process.stdout is not None
        ready = threading.Event()

        def read() -> None:
            assert self.process.stdout is not None
            if self.process.stdout.readline().strip() == "ready":
                ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout_s):
            raise RuntimeError(f"participant {self.task.index} not ready:\n{self.log_text()}")

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def wait(self, timeout_s: float) -> dict[str, Any]:
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(
                f"participant {self.task.index} ran past {timeout_s:.0f} s"
            ) from None
        if code != 0:
            raise RuntimeError(f"participant {self.task.index} exited {code}:\n{self.log_text()}")
        result: dict[str, Any] = json.loads(Path(self.task.result_path).read_text("utf-8"))
        return result

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text("utf-8")[-4000:]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._log.close()


def run_configuration(
    configuration: Configuration,
    seed: int,
    settings: Settings,
    work_dir: Path,
    *,
    timeout_s: float = 3_600.0,
) -> RunResult:
    """A fresh server and N participants; returns the global model's evaluation curve."""
    run_dir = work_dir / f"{configuration.key.replace(' ', '_')}_seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    server = BenchServer(run_dir / "server", configuration, settings)
    participants: list[Participant] = []
    try:
        seed_session(server.address, settings, seed, configuration.algo)
        for index in range(configuration.n):
            task = ParticipantTask(
                index=index,
                participant_id=f"p{index}",
                address=server.address,
                state_dir=str(run_dir / f"p{index}"),
                result_path=str(run_dir / f"p{index}.json"),
                seed=seed,
                mode=configuration.mode,
                sync_interval=configuration.sync_interval,
                settings=settings,
                algo=configuration.algo,
                save_local_every_mark=configuration.mode == "exchange" and index == 0,
            )
            participants.append(Participant(task, run_dir / f"p{index}.log"))
        for participant in participants:
            participant.wait_ready(300.0)
        start_ms = int(time.time() * 1000)
        for participant in participants:
            participant.go()
        results = [p.wait(timeout_s) for p in participants]
        run_seconds = time.time() - start_ms / 1000
        versions = server.versions()
    finally:
        for participant in participants:
            participant.kill()
        server.stop()
    return _evaluate(
        configuration,
        seed,
        settings,
        run_dir=run_dir,
        start_ms=start_ms,
        results=results,
        versions=versions,
        run_seconds=run_seconds,
    )


def _evaluate(
    configuration: Configuration,
    seed: int,
    settings: Settings,
    *,
    run_dir: Path,
    start_ms: int,
    results: list[dict[str, Any]],
    versions: list[pb.VersionState],
    run_seconds: float,
) -> RunResult:
    engine_config, learner_config = engine_configs(settings, seed, configuration.algo)
    probe = TrainingEngine(engine_config, learner_config)
    network = probe.learner.online
    probe.close()
    evaluator = Evaluator(
        settings.env,
        episodes=settings.eval_episodes,
        seed=np.random.SeedSequence([seed, 7_919]),
        max_steps=100_000,
    )
    created = [v.created_unix_ms for v in versions]
    cache: dict[int, float] = {}

    def evaluate(weights: Sequence[tuple[str, np.ndarray]]) -> float:
        load_named_arrays(network, weights)

        def greedy(obs: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                batch = torch.from_numpy(obs)
                if isinstance(network, ActorCritic):
                    return np.asarray(network.greedy(batch).numpy())
                return np.asarray(network(batch).argmax(dim=1).numpy())

        return evaluator.run_policy(greedy).mean

    def evaluate_version(state: pb.VersionState) -> float:
        if state.version not in cache:
            with np.load(run_dir / "server" / state.checkpoint, allow_pickle=False) as archive:
                cache[state.version] = evaluate([(n, np.array(archive[n])) for n in archive.files])
        return cache[state.version]

    marks = list(range(settings.eval_every, settings.budget_steps + 1, settings.eval_every))
    returns: list[float | None] = []
    seconds: list[float] = []
    evaluated: list[int] = []
    steps_to_target: int | None = None
    seconds_to_target: float | None = None
    try:
        for mark in marks:
            times = [r["marks"][str(mark)] for r in results if str(mark) in r["marks"]]
            when = statistics.median(times)
            seconds.append((when - start_ms) / 1000)
            if configuration.mode == "exchange":
                value: float | None = evaluate(
                    _load_weights(run_dir / "p0" / "local" / f"{mark}.npz")
                )
                evaluated.append(-1)
            else:
                # The newest version committed by then (created times are the server's clock).
                index = int(np.searchsorted(created, when, side="right")) - 1
                if index < 0:
                    value = None
                    evaluated.append(-1)
                else:
                    value = evaluate_version(versions[index])
                    evaluated.append(versions[index].version)
            returns.append(value)
            if steps_to_target is None and value is not None and value >= settings.target:
                steps_to_target, seconds_to_target = mark, seconds[-1]
        initial_return = evaluate_version(versions[0])
    finally:
        evaluator.close()
    return RunResult(
        configuration=configuration,
        seed=seed,
        marks=marks,
        returns=returns,
        seconds=seconds,
        versions=evaluated,
        initial_return=initial_return,
        steps_to_target=steps_to_target,
        seconds_to_target=seconds_to_target,
        total_versions=len(versions),
        run_seconds=run_seconds,
        foreign_transitions=sum(int(r["foreign_transitions"]) for r in results),
    )


# Summary.


def median_or_none(values: Sequence[float | None]) -> float | None:
    """Median with unsolved seeds as infinity; None when the median itself is unsolved."""
    if not values:
        return None
    middle = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(middle) else float(middle)


@dataclass
class Summary:
    """Per configuration, over its seeds."""

    configuration: Configuration
    solved: int
    seeds: int
    steps: float | None
    seconds: float | None
    steps_speedup: float | None = None
    wall_speedup: float | None = None
    exchange_cut: float | None = None
    """Change in steps to target against weight averaging alone with the same N and settings."""
    cores_per_participant: float = 0.0
    per_seed_steps: list[int | None] = field(default_factory=list)
    mean_return: float = 0.0
    """Mean greedy return over all marks and seeds: how fast it learns even below the target."""


def summarise(results: Sequence[RunResult], cores: int) -> list[Summary]:
    by_config: dict[Configuration, list[RunResult]] = {}
    for result in results:
        by_config.setdefault(result.configuration, []).append(result)
    summaries = {
        c: Summary(
            configuration=c,
            solved=sum(r.steps_to_target is not None for r in rs),
            seeds=len(rs),
            steps=median_or_none([r.steps_to_target for r in rs]),
            seconds=median_or_none(
                [r.seconds_to_target if r.steps_to_target is not None else None for r in rs]
            ),
            cores_per_participant=cores / c.n,
            per_seed_steps=[r.steps_to_target for r in sorted(rs, key=lambda r: r.seed)],
            mean_return=statistics.fmean(v for r in rs for v in r.returns if v is not None),
        )
        for c, rs in by_config.items()
    }
    for c, s in summaries.items():
        base = summaries.get(c.baseline)
        if base is not None and base.steps is not None and s.steps is not None:
            s.steps_speedup = base.steps / s.steps
            # Wall clock compares only where nobody had to share a core.
            if s.cores_per_participant >= 1 and base.seconds and s.seconds:
                s.wall_speedup = base.seconds / s.seconds
        averaging = summaries.get(replace(c, mode="avg"))
        if c.mode != "avg" and averaging is not None and averaging.steps and s.steps:
            s.exchange_cut = 1.0 - s.steps / averaging.steps
    return sorted(
        summaries.values(),
        key=lambda s: (
            s.configuration.sync_interval,
            s.configuration.buffer_size,
            MODES.index(s.configuration.mode),
            s.configuration.n,
        ),
    )


def _k(buffer_size: int) -> str:
    return "auto" if buffer_size == 0 else str(buffer_size)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(summaries: Sequence[Summary], settings: Settings) -> None:
    """One row per configuration, its N = 1 baseline's figures beside it."""
    print(
        f"\nGlobal model, greedy return >= {settings.target:g} "
        f"({settings.eval_episodes} episodes), budget {settings.budget_steps:,} env steps "
        f"per participant, evaluated every {settings.eval_every:,}; each participant in "
        "serial mode (its actor in the learner's process)"
    )
    columns = (
        ("configuration", 32),
        ("cores/p", 7),
        ("solved", 6),
        ("steps/p", 8),
        ("N=1 steps", 9),
        ("speed-up", 8),
        ("0.8·N", 6),
        ("wall s", 7),
        ("N=1 s", 6),
        ("wall x", 6),
        ("vs avg", 7),
        ("mean ret", 8),
    )
    header = (
        f"{columns[0][0]:<{columns[0][1]}} "
        + " ".join(f"{name:>{width}}" for name, width in columns[1:])
        + "  steps per seed"
    )
    print(header)
    print("-" * len(header))
    by_config = {s.configuration: s for s in summaries}
    for s in summaries:
        c = s.configuration
        base = by_config.get(c.baseline)
        cut = None if s.exchange_cut is None else f"{100 * s.exchange_cut:+.0f}%"
        cells = (
            c.key,
            f"{s.cores_per_participant:.2f}",
            f"{s.solved}/{s.seeds}",
            _fmt(s.steps, ",.0f"),
            _fmt(base.steps if base else None, ",.0f"),
            _fmt(s.steps_speedup, ".2f"),
            f"{0.8 * c.n:.1f}" if c.n > 1 else "-",
            _fmt(s.seconds, ".0f"),
            _fmt(base.seconds if base else None, ".0f"),
            _fmt(s.wall_speedup, ".2f"),
            cut or "-",
            f"{s.mean_return:.0f}",
        )
        row = f"{cells[0]:<{columns[0][1]}} " + " ".join(
            f"{cell:>{width}}" for cell, (_, width) in zip(cells[1:], columns[1:], strict=True)
        )
        print(f"{row}  {s.per_seed_steps}")
    print(
        "speed-up = steps(N=1) / steps(N) with the same settings (target >= 0.8·N); "
        "'wall x' only where each participant had >= 1 core; 'vs avg' = change in steps "
        "of 'both'/'exchange' against weight averaging alone (target <= -30%); 'mean ret' = "
        "mean greedy return over all marks and seeds (area under the curve)."
    )


def median_curve(runs: Sequence[RunResult]) -> list[float]:
    """Median return over seeds at each mark (NaN where no seed had a global model yet)."""
    out = []
    for column in zip(*(r.returns for r in runs), strict=True):
        values = [v for v in column if v is not None]
        out.append(statistics.median(values) if values else math.nan)
    return out


def plot(results: Sequence[RunResult], path: Path, settings: Settings) -> None:
    """Evaluation return vs per-participant env steps; one panel per setting, one curve per N."""
    panels = sorted(
        {r.configuration.baseline for r in results},
        key=lambda c: (c.sync_interval, c.buffer_size, MODES.index(c.mode)),
    )
    # The object API needs no pyplot and so no display backend.
    figure = Figure(figsize=(5 * len(panels), 4), layout="tight")
    axes = figure.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    for axis, panel in zip(axes, panels, strict=True):
        ns = sorted({r.configuration.n for r in results if r.configuration.baseline == panel})
        for n in ns:
            runs = [r for r in results if r.configuration == replace(panel, n=n)]
            axis.plot(runs[0].marks, median_curve(runs), label=f"N={n} ({len(runs)} seeds)")
        axis.axhline(settings.target, color="grey", linestyle=":", linewidth=1)
        axis.set_title(
            f"{MODE_NAMES[panel.mode]}, sync {panel.sync_interval} ep, K={_k(panel.buffer_size)}"
        )
        axis.set_xlabel("env steps per participant")
        axis.legend()
    axes[0].set_ylabel(f"global greedy return, {settings.env} (median)")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


# Entry point.


def sweep(args: argparse.Namespace, cores: int) -> list[Configuration]:
    if args.quick:
        ns, modes = [1, 2, 4], ["avg", "both"]
        syncs, buffers = [RECOMMENDED.sync_interval], [RECOMMENDED.buffer_size]
    else:
        ns = [1, 2, 4, *([8] if cores >= 8 else [])]
        modes, syncs, buffers = list(MODES), [2, 10, 50], [0, 1, 4]
    ns = args.n or ns
    modes = args.modes or modes
    syncs = args.sync_intervals or syncs
    buffers = args.buffer_sizes or buffers
    dqn = [
        Configuration(n=n, mode=m, sync_interval=s, buffer_size=k)
        for s, k, m, n in itertools.product(syncs, buffers, modes, ns)
    ]
    # PPO shares weights only, and pushes per update whatever the sync interval.
    ppo = [
        Configuration(n=n, mode="avg", sync_interval=syncs[0], buffer_size=k, algo="ppo")
        for k, n in itertools.product(buffers, ns)
    ]
    return (dqn if "dqn" in args.algo else []) + (ppo if "ppo" in args.algo else [])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="N=1,2,4 x {avg, both}, sync 2, automatic K, 2 seeds, 12k steps",
    )
    parser.add_argument("--seeds", type=int, nargs="+", help="run seeds (default 0 1 2; quick 0 1)")
    parser.add_argument("--n", type=int, nargs="+", help="participant counts")
    parser.add_argument("--modes", nargs="+", choices=MODES, help="what participants share")
    parser.add_argument(
        "--algo",
        nargs="+",
        choices=("dqn", "ppo"),
        default=["dqn"],
        help="the clients' algorithms (PPO: weight averaging only, a push per update)",
    )
    parser.add_argument("--sync-intervals", type=int, nargs="+", help="episodes between syncs")
    parser.add_argument(
        "--buffer-sizes", type=int, nargs="+", help="K: updates per version (0: automatic, K = N)"
    )
    parser.add_argument("--env", default=defaults.env, help="Gymnasium env id")
    parser.add_argument("--target", type=float, help="solved threshold (CartPole: 475)")
    parser.add_argument(
        "--budget", type=int, help="env steps per participant (default 20k; quick 12k)"
    )
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every)
    parser.add_argument("--eval-episodes", type=int, default=defaults.eval_episodes)
    parser.add_argument("--server-lr", type=float, default=defaults.server_lr)
    parser.add_argument("--staleness-exponent", type=float, default=defaults.staleness_exponent)
    parser.add_argument("--foreign-share", type=float, default=defaults.foreign_share)
    parser.add_argument(
        "--target-at-adoption",
        default=defaults.target_at_adoption,
        choices=TARGET_AT_ADOPTION,
    )
    parser.add_argument(
        "--delta-dtype", default=defaults.delta_dtype, choices=("bfloat16", "float16", "float32")
    )
    parser.add_argument(
        "--work-dir", type=Path, help="where runs write (default: a temp dir, removed)"
    )
    parser.add_argument("--plot", type=Path, default=Path("bench/federation.png"))
    parser.add_argument("--participant", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.participant is not None:
        die_with_parent()
        logging.basicConfig(level=logging.WARNING)
        raw = json.loads(args.participant)
        raw["settings"]["hidden"] = tuple(raw["settings"]["hidden"])
        run_participant(ParticipantTask(**{**raw, "settings": Settings(**raw["settings"])}))
        return
    if args.target is None and args.env != "CartPole-v1":
        raise SystemExit(f"--target is needed for {args.env}: the solved threshold is env-specific")
    settings = Settings(
        env=args.env,
        target=CARTPOLE_TARGET if args.target is None else args.target,
        budget_steps=args.budget or (12_000 if args.quick else 20_000),
        eval_every=args.eval_every,
        eval_episodes=args.eval_episodes,
        server_lr=args.server_lr,
        staleness_exponent=args.staleness_exponent,
        foreign_share=args.foreign_share,
        delta_dtype=args.delta_dtype,
        target_at_adoption=args.target_at_adoption,
    )
    cores = available_cores()
    seeds = args.seeds or ([0, 1] if args.quick else [0, 1, 2])
    configurations = sweep(args, cores)
    load = os.getloadavg()
    print(
        f"{len(configurations)} configurations x {len(seeds)} seeds on {cores} cores "
        f"(load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}); each participant runs serially "
        f"(workers=0), so it has {cores}/N cores; settings: {asdict(settings)}",
        flush=True,
    )
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="fedrl-bench-federation-"))
    results: list[RunResult] = []
    try:
        for seed, configuration in itertools.product(seeds, configurations):
            result = run_configuration(configuration, seed, settings, work_dir)
            results.append(result)
            curve = " ".join(_fmt(v, ".0f") for v in result.returns)
            print(
                f"{configuration.key} seed {seed}: target at {_fmt(result.steps_to_target, ',')} "
                f"steps/participant, {_fmt(result.seconds_to_target, '.0f')} s; "
                f"{result.total_versions} versions, {result.foreign_transitions:,} foreign "
                f"transitions in replays, {result.run_seconds:.0f} s; curve: {curve}",
                flush=True,
            )
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    summaries = summarise(results, cores)
    print_table(summaries, settings)
    plot(results, args.plot, settings)
    print(f"plot: {args.plot}")
    end_load = os.getloadavg()
    print(
        json.dumps(
            {
                "env": settings.env,
                "cores": cores,
                "load_start": load[0],
                "load_end": end_load[0],
                "settings": {**asdict(settings), "hidden": list(settings.hidden)},
                "seeds": seeds,
                "configurations": [
                    {
                        **asdict(s.configuration),
                        "cores_per_participant": s.cores_per_participant,
                        "solved": s.solved,
                        "seeds": s.seeds,
                        "median_steps_to_target": s.steps,
                        "median_seconds_to_target": s.seconds,
                        "steps_speedup_vs_n1": s.steps_speedup,
                        "wall_speedup_vs_n1": s.wall_speedup,
                        "exchange_cut_vs_avg": s.exchange_cut,
                        "per_seed_steps": s.per_seed_steps,
                        "mean_return": s.mean_return,
                    }
                    for s in summaries
                ],
                "runs": [
                    {
                        **asdict(r.configuration),
                        "seed": r.seed,
                        "marks": r.marks,
                        "returns": r.returns,
                        "seconds": r.seconds,
                        "versions": r.versions,
                        "initial_return": r.initial_return,
                        "steps_to_target": r.steps_to_target,
                        "seconds_to_target": r.seconds_to_target,
                        "total_versions": r.total_versions,
                        "foreign_transitions": r.foreign_transitions,
                        "run_seconds": r.run_seconds,
                    }
                    for r in results
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
