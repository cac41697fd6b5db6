"""Does federation pay off? Per-participant env steps to a solved model, N together against one.

What runs. Per task, seed and configuration (a mode and a number of
participants N), one run: N participants, each this script re-run as a
child process with `--participant TASK`, each a TrainingEngine in serial
mode (`workers=0`: its actor in its learner's process, one thread, so every
participant gets the same share of a small machine). Every mode but
"offline" runs a real `fedrl-server` on loopback (fedrl.server.launcher)
and the client's SyncLoop in each participant. The modes:

- "offline": one participant alone, no server, no sync loop: the reference.
  It starts from the same network as version 0 of the federated runs of
  that seed and uses the engine seeds of federated participant 0, so a
  federated N = 1 run differs from it only by federating;
- "weights": the client's `--share weights` (deltas averaged into global
  versions, adopted back);
- "experience": `--share experience` (transitions only: each participant
  trains its own model);
- "both": `--share both`, the client's default;
- "roles": participant 0 learns with `--share both`; participants 1..N-1
  only act (`--role actor`, TrainingEngine(learn=False)): they play the
  newest global model and push their experience to the learner. At N = 1,
  a lone learner;
- "pooled": no server and no federation: one learner alone with N times
  the envs and N times the budget, scored every N marks' worth of its
  steps, its steps (and its updates and CPU) divided by N, its target
  period the one a member of N gets. It holds all the data a group of N
  collects, all of it from its own current policy, with the lone
  learner's replay ratio: what a group could reach by sharing data
  without loss, one learner's updates doing the learning. It is not a
  bound on sharing weights too: N learners averaged every round make N
  learners' updates (CartPole's fours did 5.4× in the lock-step
  simulation, pooled 3.0×; README). At N = 1 it would be offline, and
  does not run.

Every mode's N = 1 runs (but pooled's), and the offline reference runs in
the same invocation, to the participants' budget or to `--offline-budget`:
a lone learner that misses the target within the groups' budget on half
the seeds or more has no median there, and so no speed-up can be given
against it (CartPole, seeds 0-19: 6 of 20 reach 475 within 12,000 steps,
16 of 20 within 36,000, median 23,625). The mean score compares runs over
the marks they all have. The participants use the client's defaults (sync every 2
episodes, bfloat16 deltas, the target network shifted at adoption, foreign
credit 2: each received transition earns two local steps' replay-ratio
credit, up to the receiver's own pace) and the learner's (the target
period lengthened by the square root of the credit earned per own step)
unless an option says otherwise (`--learner NAME=VALUE` changes a field of
every DQN learner, the offline reference's too), with
`evaluate_global=False`: the
bench scores the models itself after the run, so scoring takes no CPU from
training. Everyone starts from version 0 and waits for a common "go".

The server runs with the product's defaults except: `--keep-last 1000000`
(every version stays on disk to be scored after the run), `--goal-episodes
100000000` (runs end by their budget, not by the session goal),
`--no-dashboard`, and `--push-rate-per-s 1000 --push-burst 1000`. The
last because a simulated env runs far faster than real time: early, short
episodes make a sync every few tens of milliseconds, and the default limit
(2 pushes/s per participant, bursts of 10) then governs how often versions
and experience batches go out, by wall clock rather than by the sync
interval, so the figures in env steps would depend on the machine's speed.
Measured on CartPole, seed 0: a client that does not pace itself was
refused 2-3 pushes per run (N = 1, 3,000 steps, weights or experience),
each retried after a backoff; a client that paces its pushes to the
server's rate is not refused, but its runs of 6,000 steps each made 9
versions at N = 1 (weights or both) against 23-26 with the raised limit,
and 12 against 19-25 at N = 2. The
participants' logs are still searched for refusals, and their count is
reported per run ("throttled").

What is scored. Every participant notes the wall time and its CPU seconds
at each `--eval-every` mark of its own env steps. After the run, for modes
with a global model (weights, both, roles) the bench takes, per mark, the
median of those times over participants, the newest global version the
server had committed by then, and loads its checkpoint from the server's
data dir; for "offline" and "experience" it loads participant 0's own
weights, written at that mark. A score is the mean return of
`--eval-episodes` (default 20) greedy episodes on evaluation envs of the
bench's own, seeded per (seed, mark), so every configuration of a seed is
scored on the same episode starts; a version that is the newest at two
marks is played afresh at each. Participant 0's own model is scored at
every mark too, on an evaluator of its own with the same starts: it is the
agent a member holds, and it changes at every mark as a lone learner's
does, while global versions can come rarer than marks (on CartPole, a sync
every 2 episodes of 500 steps): then the two marks that count as "reached"
can score one version twice, a test a lone learner, whose two marks always
score two models, never gets. Seen in stop 25's CartPole figures: most
reached pairs of `both` were one version (this bench's "1 ver" column
counts them); on LunarLander, versions outnumbered marks and none were.

Figures per configuration, over seeds (5 by default):
- solved k/seeds: "reached" is a score at or above the target at two
  consecutive marks, and the steps to target are the first of the two;
- the median per-participant env steps to target, an unsolved seed counting
  as infinity: a configuration that mostly fails shows no figure rather
  than a flattering one; beside it, the median of the first single mark at
  or above the target (less strict);
- speed-up = the offline median / this median; the issue's target is
  0.8·N, and a line per group says whether it is met on the global model
  and on participant 0's own, or undecided: a seed counts as solved only
  once the mark after its first one confirms it, so a group whose median
  seed is unsolved decides nothing unless its budget reaches the mark after
  offline's median / (0.8·N) (the line names the --budget that would).
  CartPole's pairs ran 12,000 steps each through stop 33 where that
  target was 18,047 steps, and an unsolved median seed was read as a miss;
  run to 18,000 (stop 34, seeds 10-19), 4 of the 8 seeds their global
  model solved and 5 of the 9 their own models solved got there too late
  for a 12,000-step run to see, all within the target. For N = 1
  federated, the ratio of its median to offline's (target: within 10 %)
  and both solve rates, offline's scored within the lone participant's
  budget (its own model is offline's run for run; a longer reference run
  is for the groups);
- what each participant spent, beside every speed-up: gradient updates per
  own env step and CPU seconds (getrusage in each participant process, user
  + system, from "go" to its end and to the target mark), means over
  participants, medians over seeds;
- wall clock to target and its speed-up only where N <= cores: each
  participant is one thread, and the server takes its CPU beside them;
- the mean score over all marks (the area under the curve: how fast it
  learns even below the target);
- where a global version is scored: how many seeds reached the target on
  one version scored at both marks, and participant 0's own model's solved
  count, median steps and speed-up.

In "roles" the actors train nothing and, left alone, would run far ahead
of the learner (CartPole, N = 2, 3,000 steps each: the actor was done in
0.08 s, the learner after 10 s), so the global model scored at their marks
would be the learner's early one. They keep the learner's pace instead
(StepPace): before each round an actor waits until the learner has taken
at least as many env steps as it has, so every participant takes its steps
at the same rate, as in the modes where each one trains. Their CPU seconds
then include no waiting (it sleeps); their wall clock does.

`--even-pace` does the same for every participant of every mode: before
each round (128 env steps) a participant waits until all the others have
taken at least as many env steps. Without it the OS schedules the
participants: four learners and the server on two cores drift apart by up
to a third of a run (CartPole N = 4, 12,000 steps each: 15-25 s of ~60 s
between the first and the last to reach a mark), so a member that runs
ahead trains on less of the others' data per own step than one with a
machine of its own would. With it, a group runs as N machines of one
speed would, whatever this machine's cores. Measured (CartPole, seeds
0-9, the defaults): pairs did worse with it (4 of 10 on their own model,
5 of 10 on the global one), fours no better (the global model 10 of 10 at
5,625 steps each, 1.67×; their own 7 of 10 at 7,375, 1.27×), so the
drift is not what a group loses; it stays an option, not the default.

`--round-wait-s S` (with `--sync-steps`) runs the client's synchronous
rounds in every mode that shares weights: the members push at the same
env steps and each waits, at most S seconds, for the version and the
experience of its round (fedrl.client.federation.sync_loop).

Findings. The figures measured with this bench, and what they show, are in
the README's table of what a group of N should expect.

Usage:
  .venv/bin/python bench/federation.py --quick
  .venv/bin/python bench/federation.py                      # CartPole, every mode, N = 1 2 4
  # LunarLander (box2d extra, make bench); the README's figures (N = 4: seeds 0-2):
  .venv/bin/python bench/federation.py --task lunarlander --modes both --n 1
  .venv/bin/python bench/federation.py --task lunarlander --modes both --n 2 4 --budget 48000
  .venv/bin/python bench/federation.py --n 2 --modes both --seeds 0
  .venv/bin/python bench/federation.py --n 2 4 --modes both --sync-steps 128 --round-wait-s 5
  .venv/bin/python bench/federation.py --n 2 4 --modes both --seeds {0..19} --offline-budget 36000 \
      --budget 18000
  # a repeat of the groups alone (the offline reference still runs; here a short one, read
  # against an earlier invocation's full-length reference):
  .venv/bin/python bench/federation.py --task lunarlander --n 2 --no-lone --modes both \
      --budget 56000 --offline-budget 4000
The last line of stdout is one JSON object with every figure; a PNG of the
score against per-participant env steps goes to --plot.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import json
import logging
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import grpc
import numpy as np
import psutil
import torch
from matplotlib.figure import Figure

from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.sync_loop import Share, SyncLoop
from fedrl.client.federation.sync_plan import SyncPlan, sync_plan
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig, available_cores
from fedrl.client.training.evaluation import Evaluator, Scorer
from fedrl.client.training.learner_config import TARGET_AT_ADOPTION, LearnerConfig, TargetAtAdoption
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.policy_network import ppo_architecture_name
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.client.training.vector_env import make_vector_env
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.launcher import ServerProcess

Mode = Literal["offline", "weights", "experience", "both", "roles", "pooled"]
Algorithm = Literal["dqn", "ppo"]
MODES: tuple[Mode, ...] = ("offline", "weights", "experience", "both", "roles", "pooled")
SHARE: dict[Mode, Share] = {
    "weights": "weights",
    "experience": "experience",
    "both": "both",
    "roles": "both",
}
"""What each federated mode has the client share (SyncLoop's `share`, the client's --share)."""
LOCAL_MODEL_MODES: tuple[Mode, ...] = ("offline", "experience", "pooled")
"""Modes with no global model to score: participant 0's own weights are scored instead."""
SERVERLESS_MODES: tuple[Mode, ...] = ("offline", "pooled")
"""Modes that run no server: their one participant starts from version 0 itself."""
PPO_MODES: tuple[Mode, ...] = ("offline", "weights", "pooled")
"""PPO learns from its own rollouts: it shares weights only and has no acting-only role."""
MODE_NAMES: dict[Mode, str] = {
    "offline": "offline (alone, no server)",
    "weights": "weights (global model)",
    "experience": "experience (p0's own model)",
    "both": "weights + experience (global model)",
    "roles": "p0 learns, the others act (global model)",
    "pooled": "pooled: one learner, N x envs and steps",
}
SESSION = "default"
_CLIENT = TrainConfig()
_EXCHANGE = ExchangeConfig()


# Configuration.


@dataclass(frozen=True)
class Task:
    """An environment, the score that counts as solved, and the run's length."""

    env: str
    target: float
    budget_steps: int
    """Env steps each participant takes."""
    eval_every: int
    """Per-participant env steps between marks."""


TASKS: dict[str, Task] = {
    # Gymnasium's threshold for solved.
    "cartpole": Task("CartPole-v1", target=475.0, budget_steps=12_000, eval_every=250),
    # Gymnasium counts 200 as solved. A lone participant reaches 100 (two marks
    # in a row) after 52k-88k steps (median 84k over seeds 0-4), so it gets
    # 120k; groups need far fewer (the README runs them with --budget 48000).
    "lunarlander": Task("LunarLander-v3", target=100.0, budget_steps=120_000, eval_every=4_000),
}
QUICK = replace(TASKS["cartpole"], budget_steps=8_000, eval_every=500)
"""--quick: CartPole with a budget that ends most runs near their first solve."""


@dataclass(frozen=True)
class Settings:
    """What every run of one bench invocation shares."""

    env: str = TASKS["cartpole"].env
    """Gymnasium env id of the task."""
    target: float = TASKS["cartpole"].target
    """Score (greedy mean return) that counts as solved."""
    budget_steps: int = TASKS["cartpole"].budget_steps
    """Env steps each participant takes; the run ends when all have."""
    eval_every: int = TASKS["cartpole"].eval_every
    """Per-participant env steps between marks."""
    eval_episodes: int = 20
    """Greedy episodes per score, played at once."""
    envs_per_participant: int = 16
    """Envs each participant's serial actor steps as one batch (the engine's default)."""
    hidden: tuple[int, ...] = (256, 256)
    """Q-network hidden widths (the learner's default)."""
    sync_interval: int = _CLIENT.sync_interval
    """Local episodes between syncs (the client's default)."""
    sync_steps: int | None = _CLIENT.sync_steps
    """Env steps between syncs: a round's length, or asynchronously a bound on top of the
    episodes (None: the client's: 128 in rounds, else 0, episodes only)."""
    round_wait_s: float | None = _CLIENT.round_wait_s
    """Synchronous rounds of `sync_steps` when > 0, each waiting at most this long for its
    version; 0: asynchronous; None: the client's default (5 s where rounds can form, from
    `rounds_from` members on); modes that share no weights ignore it."""
    rounds_from: int = _CLIENT.rounds_from
    """Members pushing weights from which members sync in rounds (the client's default)."""
    shared_warmup: bool = _CLIENT.shared_warmup
    """Rounds until each learner starts, for participants sharing both (the client's default)."""
    delta_dtype: str | None = _CLIENT.delta_dtype
    """Wire dtype of weight deltas (None: the client's: float32 in rounds, else bfloat16)."""
    target_at_adoption: TargetAtAdoption = _CLIENT.target_at_adoption
    """Target network when a global model is adopted (the client's default, "shift")."""
    foreign_credit: float = _EXCHANGE.foreign_credit
    """Replay-ratio credit of a received transition, as a share of a local step's."""
    round_foreign_credit: float = _EXCHANGE.round_foreign_credit
    """The same while a participant syncs in rounds (the client's default)."""
    pull_transitions: int = _EXCHANGE.pull_transitions
    """Most of the others' transitions a participant pulls per sync (the client's default)."""
    credit_at_own_pace: bool = _EXCHANGE.credit_at_own_pace
    """Credit for a sender's transitions up to the receiver's own count (the client's default)."""
    buffer_size: int | None = None
    """Updates per global version (K); None: the server's default (automatic, K = N)."""
    server_lr: float | None = None
    """Server learning rate; None: the server's default."""
    learner: tuple[tuple[str, str], ...] = ()
    """DQN LearnerConfig fields changed from the defaults, as (name, value) text (--learner)."""
    offline_budget_steps: int | None = None
    """Env steps of the offline reference; None: `budget_steps`, as everyone's."""
    pooled_over: int = 1
    """Participants whose envs and steps one learner takes ("pooled"); 1 for everyone else."""
    even_pace: bool = False
    """Every participant waits before each round until all the others have taken as many env
    steps: as if each had a machine of its own, all of one speed (`--even-pace`)."""

    @property
    def marks(self) -> list[int]:
        """Per-participant env steps at which every run is scored."""
        return list(range(self.eval_every, self.budget_steps + 1, self.eval_every))

    def sync_plan(self, share: Share, *, on_policy: bool) -> SyncPlan:
        """How a participant sharing `share` syncs, resolved as the client's command resolves
        it; experience-only participants sync asynchronously whatever the settings say."""
        return sync_plan(
            round_wait_s=0.0 if share == "experience" else self.round_wait_s,
            sync_steps=self.sync_steps,
            delta_dtype=self.delta_dtype,
            rounds_from=self.rounds_from,
            sync_interval=self.sync_interval,
            share=share,
            on_policy=on_policy,
            shared_warmup=self.shared_warmup,
        )

    def of(self, mode: Mode) -> Settings:
        """The settings a participant of `mode` runs by: the offline reference's own budget."""
        if mode == "offline" and self.offline_budget_steps is not None:
            return replace(self, budget_steps=self.offline_budget_steps)
        return self

    def pooled(self, n: int) -> Settings:
        """The settings of one learner that collects what n participants would: its marks are
        those of these settings, times n."""
        return replace(
            self,
            envs_per_participant=self.envs_per_participant * n,
            budget_steps=self.budget_steps * n,
            eval_every=self.eval_every * n,
            pooled_over=n,
        )


@dataclass(frozen=True)
class Configuration:
    """One cell of the sweep; run once per seed."""

    n: int
    """Participants."""
    mode: Mode
    algo: Algorithm = "dqn"

    @property
    def key(self) -> str:
        return f"{self.algo} {self.mode} N={self.n}"

    @property
    def reference(self) -> Configuration:
        """What the speed-up is measured against: one participant alone, offline."""
        return Configuration(n=1, mode="offline", algo=self.algo)

    @property
    def scores_local_model(self) -> bool:
        return self.mode in LOCAL_MODEL_MODES

    @property
    def processes(self) -> int:
        """Participant processes of a run: N, or one learner for the whole pool."""
        return 1 if self.mode == "pooled" else self.n

    @property
    def pooled_over(self) -> int:
        """Participants whose steps one process takes (N pooled, else 1): its env steps,
        updates and CPU are divided by this to be per participant."""
        return self.n if self.mode == "pooled" else 1


RECOMMENDED = Configuration(n=1, mode="both")
"""The client's and server's defaults (N varies): weights and experience, every participant
learning."""


@dataclass(frozen=True)
class ParticipantTask:
    """Everything one participant process needs, passed as JSON on its command line."""

    index: int
    participant_id: str
    address: str
    """The server's host:port; "" offline."""
    state_dir: str
    result_path: str
    seed: int
    mode: Mode
    settings: Settings
    algo: Algorithm = "dqn"
    learns: bool = True
    """False: an actor of mode "roles" (TrainingEngine(learn=False))."""
    save_local: bool = False
    """Write the local weights at every mark (participant 0 where no global model is scored)."""
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
    throttled: int = 0
    """Pushes the server refused by its rate limit (retried later), from its log."""


@dataclass(frozen=True)
class RunResult:
    """One seed of one configuration: the score at every mark and what it cost."""

    configuration: Configuration
    seed: int
    marks: list[int]
    """Per-participant env steps of each mark."""
    returns: list[float]
    """Score at each mark."""
    seconds: list[float]
    """Wall clock from the common start to each mark (the median over participants where a
    global model is scored, participant 0's own time where its local model is)."""
    versions: list[int]
    """Global version scored at each mark (-1: participant 0's local model)."""
    own_returns: list[float]
    """Score of participant 0's own model at each mark: the agent a member holds (the same
    as `returns` where that is what is scored; in "roles" participant 0 is the learner)."""
    initial_return: float
    """Score of the network every participant started from (version 0)."""
    participants: list[ParticipantReport]
    total_versions: int
    run_seconds: float
    server_cpu_seconds: float
    """CPU of the server process over the run (0 offline)."""
    target: float

    @property
    def reached(self) -> int | None:
        """Index of the mark at which the target was reached (two consecutive marks)."""
        return reached_at(self.returns, self.target)

    @property
    def steps_to_target(self) -> int | None:
        index = self.reached
        return None if index is None else self.marks[index]

    @property
    def own_steps_to_target(self) -> int | None:
        """Steps to target of participant 0's own model, two consecutive marks as for any."""
        index = reached_at(self.own_returns, self.target)
        return None if index is None else self.marks[index]

    @property
    def reached_on_one_version(self) -> bool:
        """Whether the two marks that reached the target scored the same global version.

        Versions can come rarer than marks (a sync every 2 episodes of 500
        steps), and then one model scored twice passes the test meant to
        show that a learner stays good while it trains on; a lone learner's
        two marks always score two models.
        """
        index = self.reached
        return index is not None and self.versions[index] == self.versions[index + 1] >= 0

    @property
    def first_mark_at_target(self) -> int | None:
        """The first single mark at or above the target: the less strict figure."""
        index = reached_at(self.returns, self.target, consecutive=1)
        return None if index is None else self.marks[index]

    @property
    def seconds_to_target(self) -> float | None:
        index = self.reached
        return None if index is None else self.seconds[index]

    @property
    def cpu_to_target(self) -> float | None:
        """CPU seconds each participant had spent when the target was reached (mean)."""
        index = self.reached
        if index is None:
            return None
        share = self.configuration.pooled_over
        return statistics.fmean(p.mark_cpu[index] / share for p in self.participants)

    @property
    def updates_per_step(self) -> float:
        """Gradient updates per own env step, mean over participants (actors count 0); a pooled
        learner's per participant's step."""
        share = self.configuration.pooled_over
        return statistics.fmean(p.updates * share / max(1, p.env_steps) for p in self.participants)

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds per participant (a pooled learner's, divided among its N)."""
        share = self.configuration.pooled_over
        return statistics.fmean(p.cpu_seconds / share for p in self.participants)

    @property
    def foreign_received(self) -> int:
        return sum(p.foreign_received for p in self.participants)

    @property
    def throttled(self) -> int:
        return sum(p.throttled for p in self.participants)


# Pure figures: when a target counts as reached, and the summaries over seeds.


def reached_at(returns: Sequence[float], target: float, *, consecutive: int = 2) -> int | None:
    """Index of the first of `consecutive` marks in a row scoring at least `target`; None if none.

    Two in a row by default: one lucky score of a still-wobbling model does
    not count as solved.
    """
    if consecutive < 1:
        raise ValueError(f"consecutive must be at least 1, got {consecutive}")
    run = 0
    for index, value in enumerate(returns):
        run = run + 1 if value >= target else 0
        if run == consecutive:
            return index - consecutive + 1
    return None


def median_or_none(values: Sequence[float | None]) -> float | None:
    """Median with unsolved seeds (None) as infinity; None when the median itself is unsolved."""
    if not values:
        return None
    middle = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(middle) else float(middle)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None where either is missing (or the denominator is 0)."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def median_curve(runs: Sequence[RunResult]) -> list[float]:
    """The median score over seeds at each mark."""
    return [statistics.median(column) for column in zip(*(r.returns for r in runs), strict=True)]


@dataclass(frozen=True)
class Summary:
    """One configuration over its seeds; speed-ups against the offline reference."""

    configuration: Configuration
    seeds: int
    solved: int
    steps: float | None
    """Median per-participant env steps to target (None: the median seed did not reach it)."""
    first_mark: float | None
    """Median of the first single mark at or above the target."""
    seconds: float | None
    """Median wall clock to target."""
    updates_per_step: float
    cpu_seconds: float
    """CPU seconds per participant for the whole run (median over seeds)."""
    cpu_to_target: float | None
    """CPU seconds per participant to the target (median, unsolved as infinity)."""
    mean_return: float
    """Mean score over the marks every run has, over seeds: the area under the curve."""
    per_seed_steps: list[int | None]
    own_solved: int
    """Seeds where participant 0's own model reached the target."""
    own_steps: float | None
    """Median steps to target of participant 0's own model."""
    own_per_seed_steps: list[int | None]
    one_version: int
    """Seeds whose target was reached by one global version scored at two marks."""
    own_cores: bool
    """N <= cores: each participant had a core of its own, so wall clock compares (never for
    "pooled": one process does N participants' work)."""
    speedup: float | None = None
    """Offline median steps / this median."""
    own_speedup: float | None = None
    """Offline median steps / the median of participant 0's own model."""
    wall_speedup: float | None = None
    """Offline median wall clock / this one (only where own_cores)."""
    reference_solved: int | None = None
    """The offline reference's solved count, beside this one's."""
    budget: int = 0
    """Per-participant env steps of the longest of its runs (its last mark)."""
    mark_every: int = 0
    """Per-participant env steps between its marks."""
    target_steps: float | None = None
    """Steps each that meet the issue's 0.8·N target: offline's median / (0.8·N) (N >= 2
    with an offline median only)."""

    @property
    def verdict(self) -> Verdict | None:
        """Whether the global (or scored) model meets the 0.8·N target (None: no target)."""
        return target_verdict(self.steps, self.target_steps, self.budget, self.mark_every)

    @property
    def own_verdict(self) -> Verdict | None:
        """The same for participant 0's own model."""
        return target_verdict(self.own_steps, self.target_steps, self.budget, self.mark_every)

    @property
    def steps_vs_reference(self) -> float | None:
        """This median over offline's: N = 1 federated should stay within 1.1 of it."""
        return None if self.speedup is None else 1.0 / self.speedup

    @property
    def own_steps_vs_reference(self) -> float | None:
        """The same for participant 0's own model: at N = 1 it is offline's, run for run."""
        return None if self.own_speedup is None else 1.0 / self.own_speedup


Verdict = Literal["met", "missed", "undecided"]


def target_verdict(
    steps: float | None, target_steps: float | None, budget: int, mark_every: int
) -> Verdict | None:
    """Met or missed, or undecided where the budget ended before the target's steps.

    A seed counts as solved at a mark only once the next mark confirms it, so
    runs decide the target only if their budget holds the last mark at or
    below `target_steps` and the one after it; a median left unsolved within a
    shorter budget says nothing (CartPole's pairs ran 12,000 steps each where
    the target was 18,047 in stops 31-33).
    """
    if target_steps is None:
        return None
    if steps is not None:
        return "met" if steps <= target_steps else "missed"
    needed = (math.floor(target_steps / mark_every) + 1) * mark_every
    return "missed" if budget >= needed else "undecided"


def summarise(results: Sequence[RunResult], cores: int) -> list[Summary]:
    """One Summary per configuration, in sweep order, each against its offline reference."""
    by_config: dict[Configuration, list[RunResult]] = {}
    for result in results:
        by_config.setdefault(result.configuration, []).append(result)
    # An offline reference run longer than the groups is scored over their marks only.
    shared = min((r.marks[-1] for r in results), default=0)
    plain = {
        c: _summary(c, sorted(rs, key=lambda r: r.seed), cores, shared)
        for c, rs in by_config.items()
    }

    def reference(summary: Summary) -> Summary | None:
        """Offline's summary; for N = 1, offline's within the same budget: a lone
        participant's own model is offline's run for run, so it can only be held to what
        offline reached in as many steps (a longer reference run is for the groups)."""
        c = summary.configuration
        full = plain.get(c.reference)
        if c.n > 1 or full is None or full.budget <= summary.budget:
            return full
        runs = sorted(by_config[c.reference], key=lambda r: r.seed)
        return _summary(c.reference, [cut(r, summary.budget) for r in runs], cores, shared)

    return [_against(summary, reference(summary)) for summary in plain.values()]


def cut(result: RunResult, budget: int) -> RunResult:
    """The run as scored up to `budget` env steps each: its marks beyond it dropped."""
    kept = sum(mark <= budget for mark in result.marks)
    return replace(
        result,
        marks=result.marks[:kept],
        returns=result.returns[:kept],
        seconds=result.seconds[:kept],
        versions=result.versions[:kept],
        own_returns=result.own_returns[:kept],
    )


def _against(summary: Summary, reference: Summary | None) -> Summary:
    """The summary with its speed-ups against the offline reference (none without one)."""
    if reference is None:
        return summary
    n = summary.configuration.n
    return replace(
        summary,
        target_steps=None if n < 2 or reference.steps is None else reference.steps / (0.8 * n),
        speedup=ratio(reference.steps, summary.steps),
        own_speedup=ratio(reference.steps, summary.own_steps),
        wall_speedup=ratio(reference.seconds, summary.seconds) if summary.own_cores else None,
        reference_solved=reference.solved,
    )


def _summary(
    c: Configuration, runs: Sequence[RunResult], cores: int, shared_marks_to: int
) -> Summary:
    # A pooled learner is one process doing N participants' work: a bound in steps, not a
    # contender in wall clock.
    own_cores = c.n <= cores and c.mode != "pooled"
    return Summary(
        configuration=c,
        seeds=len(runs),
        solved=sum(r.steps_to_target is not None for r in runs),
        steps=median_or_none([r.steps_to_target for r in runs]),
        first_mark=median_or_none([r.first_mark_at_target for r in runs]),
        seconds=median_or_none([r.seconds_to_target for r in runs]) if own_cores else None,
        updates_per_step=statistics.median(r.updates_per_step for r in runs),
        cpu_seconds=statistics.median(r.cpu_seconds for r in runs),
        cpu_to_target=median_or_none([r.cpu_to_target for r in runs]),
        mean_return=statistics.fmean(
            v for r in runs for m, v in zip(r.marks, r.returns, strict=True) if m <= shared_marks_to
        ),
        per_seed_steps=[r.steps_to_target for r in runs],
        own_solved=sum(r.own_steps_to_target is not None for r in runs),
        own_steps=median_or_none([r.own_steps_to_target for r in runs]),
        own_per_seed_steps=[r.own_steps_to_target for r in runs],
        one_version=sum(r.reached_on_one_version for r in runs),
        own_cores=own_cores,
        budget=max(r.marks[-1] for r in runs),
        mark_every=runs[0].marks[0],
    )


# The participant process.


def engine_configs(
    settings: Settings, seed: int, algo: Algorithm = "dqn"
) -> tuple[EngineConfig, LearnerConfig | PPOConfig]:
    """Serial mode, no local evaluation: the bench scores the models itself."""
    engine = EngineConfig(
        env=settings.env,
        workers=0,
        envs_per_worker=settings.envs_per_participant,
        eval_interval=0,
        seed=seed,
    )
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


def learner_overrides(base: LearnerConfig, changes: Sequence[tuple[str, str]]) -> LearnerConfig:
    """base with each named scalar field set from its text; ValueError for anything else."""
    fields = {f.name for f in dataclasses.fields(LearnerConfig)}
    values: dict[str, Any] = {}
    for name, text in changes:
        if name not in fields:
            raise ValueError(f"LearnerConfig has no field {name!r}")
        current = getattr(base, name)
        if isinstance(current, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError(f"{name} takes true or false, got {text!r}")
            values[name] = text.lower() == "true"
        elif isinstance(current, int | float | str):
            try:
                values[name] = type(current)(text)
            except ValueError:
                raise ValueError(f"{name} takes a {type(current).__name__}, got {text!r}") from None
        else:
            raise ValueError(f"{name} is not a number, a flag or a word; set it in code")
    return replace(base, **values)


def name_value(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise ValueError(f"--learner takes NAME=VALUE, got {text!r}")
    return name.replace("-", "_"), value


def architecture(learner: LearnerConfig | PPOConfig) -> str:
    """The model spec's algorithm name, as the client gives it."""
    if isinstance(learner, PPOConfig):
        return ppo_architecture_name(learner.ppo_hidden, NetworkConfig())
    return architecture_name(learner.hidden, learner.dueling)


def participant_seed(seed: int, index: int) -> int:
    """Distinct, reproducible seed streams per (run seed, participant)."""
    return seed * 1_000 + index


def initial_weights(settings: Settings, seed: int, algo: Algorithm) -> list[tuple[str, Any]]:
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
        settings, participant_seed(task.seed, task.index), task.algo
    )
    # Every participant starts from version 0: no first push carries progress
    # made on another initialisation, and the offline reference starts where
    # the federated runs do (its version 0 made before its own engine, which
    # is then built exactly as federated participant 0's).
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
                if task.save_local:
                    _save_weights(state_dir / "local" / f"{next_mark}.npz", engine.weights())
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

    def __init__(self, data_dir: Path, settings: Settings) -> None:
        options = [
            # Every version stays on disk: the bench scores them after the run.
            *("--keep-last", "1000000"),
            # The run ends by budget, not by goal.
            *("--goal-episodes", "100000000"),
            # Benchmarks measure training, not the page.
            "--no-dashboard",
            # Syncs follow the sync interval, not the wall clock: a simulated
            # env syncs far more often than a real one (module docstring).
            *("--push-rate-per-s", "1000"),
            *("--push-burst", "1000"),
        ]
        if settings.buffer_size is not None:
            options += ["--buffer-size", str(settings.buffer_size)]
        if settings.server_lr is not None:
            options += ["--server-lr", str(settings.server_lr)]
        super().__init__(data_dir, *options)
        self.start()

    def versions(self) -> list[pb.VersionState]:
        """Every committed version, oldest first, with its time and checkpoint file."""
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
            reply = stub.Status(pb.StatusRequest(session=SESSION, max_versions=1_000_000))
        if not reply.sessions:
            return []
        return sorted(reply.sessions[0].versions, key=lambda v: v.version)

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)


def seed_session(
    address: str, weights: list[tuple[str, Any]], settings: Settings, algo: Algorithm
) -> None:
    """Version 0: the run's initial network, seeded by the bench itself."""
    spec = model_spec(settings.env, weights, architecture(learner_config(settings, algo)))

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

    def wait(self, timeout_s: float) -> ParticipantReport:
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(
                f"participant {self.task.index} ran past {timeout_s:.0f} s"
            ) from None
        if code != 0:
            raise RuntimeError(f"participant {self.task.index} exited {code}:\n{self.log_text()}")
        raw = json.loads(Path(self.task.result_path).read_text("utf-8"))
        self._log.flush()
        # The client logs each refused push ("... rate limit ...") before retrying it.
        throttled = self.log_path.read_text("utf-8").count("rate limit")
        return ParticipantReport(**{**raw, "throttled": throttled})

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
    """A fresh server (none offline) and N participants; returns the scores at every mark."""
    run_dir = work_dir / f"{configuration.key.replace(' ', '_')}_seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    initial = initial_weights(settings, seed, configuration.algo)
    serverless = configuration.mode in SERVERLESS_MODES
    server = None if serverless else BenchServer(run_dir / "server", settings)
    # What the processes run by: the offline reference's budget may be its own; a pooled
    # learner's budget and marks are N participants' (pooled over 1, everyone else's
    # settings are the invocation's).
    per_participant = settings.of(configuration.mode)
    run_settings = per_participant.pooled(configuration.pooled_over)
    participants: list[Participant] = []
    pace_files = [str(run_dir / f"p{index}.steps") for index in range(configuration.processes)]
    follows = [paced_by(configuration, settings, index) for index in range(configuration.processes)]
    # Only a participant someone follows writes its steps: the others skip a file write a round.
    followed = {other for others in follows for other in others}
    try:
        if server is not None:
            seed_session(server.address, initial, settings, configuration.algo)
        for index in range(configuration.processes):
            task = ParticipantTask(
                index=index,
                participant_id=f"p{index}",
                address="" if server is None else server.address,
                state_dir=str(run_dir / f"p{index}"),
                result_path=str(run_dir / f"p{index}.json"),
                seed=seed,
                mode=configuration.mode,
                settings=run_settings,
                algo=configuration.algo,
                learns=configuration.mode != "roles" or index == 0,
                save_local=index == 0,
                pace_post=pace_files[index] if index in followed else "",
                pace_follow=tuple(pace_files[other] for other in follows[index]),
            )
            participants.append(Participant(task, run_dir / f"p{index}.log"))
        for participant in participants:
            participant.wait_ready(300.0)
        start_ms = int(time.time() * 1000)
        for participant in participants:
            participant.go()
        reports = [p.wait(timeout_s) for p in participants]
        run_seconds = time.time() - start_ms / 1000
        versions = [] if server is None else server.versions()
        server_cpu = 0.0 if server is None else server.cpu_seconds()
    finally:
        for participant in participants:
            participant.kill()
        if server is not None:
            server.stop()
    curve = score_run(
        configuration,
        seed,
        run_settings,
        run_dir=run_dir,
        start_ms=start_ms,
        reports=reports,
        versions=versions,
        initial=initial,
    )
    return RunResult(
        configuration=configuration,
        seed=seed,
        marks=per_participant.marks,
        returns=curve.returns,
        seconds=curve.seconds,
        versions=curve.versions,
        own_returns=curve.own_returns,
        initial_return=curve.initial_return,
        participants=reports,
        total_versions=len(versions),
        run_seconds=run_seconds,
        server_cpu_seconds=server_cpu,
        target=settings.target,
    )


@dataclass(frozen=True)
class Curve:
    """A run's scores, as score_run finds them."""

    returns: list[float]
    seconds: list[float]
    versions: list[int]
    own_returns: list[float]
    initial_return: float


def score_run(
    configuration: Configuration,
    seed: int,
    settings: Settings,
    *,
    run_dir: Path,
    start_ms: int,
    reports: Sequence[ParticipantReport],
    versions: Sequence[pb.VersionState],
    initial: list[tuple[str, Any]],
) -> Curve:
    """Score the model of every mark: the newest global version by then, or p0's own weights;
    and p0's own weights in any case (the same scores where those are what is scored)."""
    engine_config, learner = engine_configs(settings, seed, configuration.algo)
    probe = TrainingEngine(engine_config, learner)
    network = probe.learner.online
    probe.close()

    # One evaluator per run and model, used once per mark in order: mark i of
    # every configuration of this seed is played from the same episode starts.
    def new_scorer() -> Scorer:
        return Scorer(
            network,
            Evaluator(
                settings.env,
                episodes=settings.eval_episodes,
                seed=np.random.SeedSequence([seed, 7_919]),
                max_steps=100_000,
            ),
        )

    scorer = new_scorer()
    # Where p0's own weights are what is scored, their scores are the curve's.
    own_scorer = None if configuration.scores_local_model else new_scorer()
    created = [v.created_unix_ms for v in versions]
    returns: list[float] = []
    own_returns: list[float] = []
    seconds: list[float] = []
    scored: list[int] = []
    try:
        for index, mark in enumerate(settings.marks):
            own = _load_weights(run_dir / "p0" / "local" / f"{mark}.npz")
            when: float
            if configuration.scores_local_model:
                when = reports[0].mark_ms[index]
                weights = own
                scored.append(-1)
            else:
                when = statistics.median(p.mark_ms[index] for p in reports)
                # The newest version committed by then (created times are the
                # server's clock, on this machine). Version 0 was committed
                # before the start, so there always is one.
                newest = max(0, int(np.searchsorted(created, when, side="right")) - 1)
                weights = _load_checkpoint(run_dir / "server" / versions[newest].checkpoint)
                scored.append(versions[newest].version)
            seconds.append((when - start_ms) / 1000)
            returns.append(scorer.score(weights).mean)
            own_returns.append(returns[-1] if own_scorer is None else own_scorer.score(own).mean)
        initial_return = scorer.score(initial).mean
    finally:
        scorer.close()
        if own_scorer is not None:
            own_scorer.close()
    return Curve(
        returns=returns,
        seconds=seconds,
        versions=scored,
        own_returns=own_returns,
        initial_return=initial_return,
    )


def _load_checkpoint(path: Path) -> list[tuple[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as archive:
        return [(name, np.array(archive[name])) for name in archive.files]


# Output.


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _own(result: RunResult) -> str:
    """What a run line adds where a global version, not participant 0's model, is scored."""
    if result.configuration.scores_local_model:
        return ""
    once = ", one version scored twice" if result.reached_on_one_version else ""
    return f"{once}; participant 0's own model {_fmt(result.own_steps_to_target, ',')}"


def _dashes(values: Sequence[int | None]) -> list[int | str]:
    return ["-" if v is None else v for v in values]


def run_line(result: RunResult) -> str:
    """One run's figures, printed as it ends."""
    curve = " ".join(f"{v:.0f}" for v in result.returns)
    return (
        f"{result.configuration.key} seed {result.seed}: target at "
        f"{_fmt(result.steps_to_target, ',')} steps/participant "
        f"(first mark {_fmt(result.first_mark_at_target, ',')}{_own(result)}), "
        f"{_fmt(result.seconds_to_target, '.0f')} s; {result.updates_per_step:.2f} updates/step, "
        f"{result.cpu_seconds:.1f} CPU s/participant, server {result.server_cpu_seconds:.1f} CPU "
        f"s; {result.total_versions} versions, {result.foreign_received:,} foreign transitions "
        f"received, {result.throttled} pushes throttled; {result.run_seconds:.0f} s; "
        f"curve: {curve}"
    )


COLUMNS = (
    ("configuration", 22),
    ("solved", 6),
    ("steps/p", 8),
    ("speed-up", 8),
    ("0.8·N", 5),
    ("1st mark", 8),
    ("1 ver", 5),
    ("p0 own", 6),
    ("p0 steps", 8),
    ("p0 x", 5),
    ("upd/step", 8),
    ("CPU s/p", 7),
    ("CPU→tgt", 7),
    ("wall s", 6),
    ("wall x", 6),
    ("mean", 5),
)


def _offline_budget(settings: Settings) -> str:
    if settings.offline_budget_steps is None:
        return ""
    return (
        f" ({settings.offline_budget_steps:,} offline: its CPU s is its whole run's; the mean "
        "score is over the marks every run has)"
    )


def table_lines(summaries: Sequence[Summary], settings: Settings, cores: int) -> Iterator[str]:
    """The table: one row per configuration, then the N = 1 checks against offline."""
    yield (
        f"\n{settings.env}: score = mean of {settings.eval_episodes} greedy episodes; "
        f"reached = >= {settings.target:g} at two consecutive marks (every "
        f"{settings.eval_every:,} env steps); budget {settings.budget_steps:,} env steps per "
        f"participant{_offline_budget(settings)}; each participant one thread (serial mode)"
    )
    header = (
        f"{COLUMNS[0][0]:<{COLUMNS[0][1]}} "
        + " ".join(f"{name:>{width}}" for name, width in COLUMNS[1:])
        + "  steps per seed"
    )
    yield header
    yield "-" * len(header)
    for s in summaries:
        c = s.configuration
        cells = (
            c.key,
            f"{s.solved}/{s.seeds}",
            _fmt(s.steps, ",.0f"),
            _fmt(s.speedup, ".2f"),
            f"{0.8 * c.n:.1f}" if c.n > 1 else "-",
            _fmt(s.first_mark, ",.0f"),
            f"{s.one_version}",
            f"{s.own_solved}/{s.seeds}",
            _fmt(s.own_steps, ",.0f"),
            _fmt(s.own_speedup, ".2f"),
            f"{s.updates_per_step:.2f}",
            f"{s.cpu_seconds:.1f}",
            _fmt(s.cpu_to_target, ".1f"),
            _fmt(s.seconds, ".0f"),
            _fmt(s.wall_speedup, ".2f"),
            f"{s.mean_return:.0f}",
        )
        row = f"{cells[0]:<{COLUMNS[0][1]}} " + " ".join(
            f"{cell:>{width}}" for cell, (_, width) in zip(cells[1:], COLUMNS[1:], strict=True)
        )
        own = "" if c.scores_local_model else f" p0 own {_dashes(s.own_per_seed_steps)}"
        yield f"{row}  {_dashes(s.per_seed_steps)}{own}"
    yield (
        "steps/p: median per-participant env steps to target (unsolved seeds as infinity); "
        "speed-up: offline's median / this one (target >= 0.8·N); 1st mark: median first "
        "single mark >= target; 1 ver: seeds whose two marks scored one global version twice "
        "(a lone learner's two marks are two models); p0 own, p0 steps, p0 x: solved, median "
        "steps and speed-up of participant 0's own model, the agent a member holds; upd/step: "
        "gradient updates per own env step and CPU s/p: CPU "
        "seconds, means over participants (actors count 0 updates); CPU→tgt: CPU s/p to the "
        f"target; wall s and wall x (offline's / this) only where N <= {cores} cores, the "
        "server sharing them; mean: mean score over all marks (area under the curve); pooled: "
        "one learner with N times the envs and steps and a member's target period, its "
        "figures per participant: the most that sharing data without loss could give one "
        "learner's updates."
    )
    verdicts = [s for s in summaries if s.target_steps is not None]
    if verdicts:
        yield "N >= 2 against the 0.8·N target (steps each at most offline's median / (0.8·N)):"
    for s in verdicts:
        yield f"  {s.configuration.key}: {verdict_line(s)}"
    checks = [s for s in summaries if s.configuration.n == 1 and s.configuration.mode != "offline"]
    if checks:
        yield "N = 1 federated against offline (target: steps within 10 %, solve rate no lower):"
    for s in checks:
        yield (
            f"  {s.configuration.key}: steps x{_fmt(s.steps_vs_reference, '.2f')} of offline's, "
            f"solved {s.solved}/{s.seeds} against {_fmt(s.reference_solved, 'd')}/{s.seeds} "
            f"(offline within the same {s.budget:,} steps); "
            f"participant 0's own model: steps x{_fmt(s.own_steps_vs_reference, '.2f')}, "
            f"solved {s.own_solved}/{s.seeds}"
        )


def verdict_line(summary: Summary) -> str:
    """The target's steps, and whether the global and the own model meet them."""
    assert summary.target_steps is not None
    models = [
        ("scored model" if summary.configuration.scores_local_model else "global", summary.verdict)
    ]
    if not summary.configuration.scores_local_model:
        models.append(("participant 0's own", summary.own_verdict))
    said = "; ".join(f"{name} {verdict}" for name, verdict in models)
    line = f"target {summary.target_steps:,.0f} steps each: {said}"
    if "undecided" in (summary.verdict, summary.own_verdict):
        needed = (math.floor(summary.target_steps / summary.mark_every) + 1) * summary.mark_every
        line += (
            f" (the median seed did not reach it within {summary.budget:,} steps, short of the "
            f"{needed:,} that would decide it: run with --budget {needed})"
        )
    return line


def plot(results: Sequence[RunResult], path: Path, settings: Settings) -> None:
    """Median score against per-participant env steps: one panel per mode, one curve per N.

    Offline is drawn in every panel (dashed) as the reference; it has a panel
    of its own only when nothing else ran.
    """
    modes = [m for m in MODES if any(r.configuration.mode == m for r in results)]
    panels = [m for m in modes if m != "offline"] or modes
    algos = sorted({r.configuration.algo for r in results})
    # The object API needs no pyplot and so no display backend.
    figure = Figure(figsize=(4.5 * len(panels), 4), layout="tight")
    axes = figure.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    for axis, mode in zip(axes, panels, strict=True):
        for algo in algos:
            prefix = f"{algo} " if len(algos) > 1 else ""
            offline = [r for r in results if r.configuration == Configuration(1, "offline", algo)]
            if offline and mode != "offline":
                axis.plot(
                    offline[0].marks,
                    median_curve(offline),
                    color="grey",
                    linestyle="--",
                    label=f"{prefix}offline ({len(offline)} seeds)",
                )
            ns = sorted({r.configuration.n for r in results if r.configuration.mode == mode})
            for n in ns:
                runs = [r for r in results if r.configuration == Configuration(n, mode, algo)]
                if runs:
                    label = f"{prefix}N={n} ({len(runs)} seeds)"
                    axis.plot(runs[0].marks, median_curve(runs), label=label)
        axis.axhline(settings.target, color="grey", linestyle=":", linewidth=1)
        axis.set_title(MODE_NAMES[mode])
        axis.set_xlabel("env steps per participant")
        axis.legend()
    axes[0].set_ylabel(f"greedy score, {settings.env} (median over seeds)")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def report(
    results: Sequence[RunResult],
    summaries: Sequence[Summary],
    settings: Settings,
    *,
    cores: int,
    seeds: Sequence[int],
    load: tuple[float, float],
) -> dict[str, Any]:
    """Every figure, per configuration and per seed: the bench's last line."""
    return {
        "env": settings.env,
        "cores": cores,
        "load_start": load[0],
        "load_end": load[1],
        "settings": {**asdict(settings), "hidden": list(settings.hidden)},
        "seeds": list(seeds),
        "configurations": [
            {
                **asdict(s.configuration),
                "own_cores": s.own_cores,
                "seeds": s.seeds,
                "solved": s.solved,
                "median_steps_to_target": s.steps,
                "median_first_mark_at_target": s.first_mark,
                "speedup_vs_offline": s.speedup,
                "target_speedup": 0.8 * s.configuration.n if s.configuration.n > 1 else None,
                "target_steps": s.target_steps,
                "target_verdict": s.verdict,
                "own_target_verdict": s.own_verdict,
                "budget_steps": s.budget,
                "steps_vs_offline": s.steps_vs_reference,
                "offline_solved": s.reference_solved,
                "median_seconds_to_target": s.seconds,
                "wall_speedup_vs_offline": s.wall_speedup,
                "updates_per_env_step": s.updates_per_step,
                "cpu_seconds_per_participant": s.cpu_seconds,
                "cpu_seconds_to_target_per_participant": s.cpu_to_target,
                "mean_return": s.mean_return,
                "per_seed_steps": s.per_seed_steps,
                "reached_on_one_version": s.one_version,
                "own_solved": s.own_solved,
                "own_median_steps_to_target": s.own_steps,
                "own_speedup_vs_offline": s.own_speedup,
                "own_per_seed_steps": s.own_per_seed_steps,
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
                "first_mark_at_target": r.first_mark_at_target,
                "reached_on_one_version": r.reached_on_one_version,
                "own_returns": r.own_returns,
                "own_steps_to_target": r.own_steps_to_target,
                "seconds_to_target": r.seconds_to_target,
                "cpu_seconds_to_target": r.cpu_to_target,
                "updates_per_env_step": r.updates_per_step,
                "cpu_seconds": r.cpu_seconds,
                "total_versions": r.total_versions,
                "foreign_received": r.foreign_received,
                "throttled": r.throttled,
                "run_seconds": r.run_seconds,
                "server_cpu_seconds": r.server_cpu_seconds,
                "participants": [asdict(p) for p in r.participants],
            }
            for r in results
        ],
    }


# Entry point.


def resolve_task(
    task: Task,
    *,
    env: str | None = None,
    target: float | None = None,
    budget: int | None = None,
    eval_every: int | None = None,
) -> Task:
    """`task`, or the one --env names, with any figure the options give instead."""
    if env is not None and env != task.env:
        by_env = {t.env: t for t in TASKS.values()}
        if env in by_env:
            task = by_env[env]
        elif target is None:
            raise ValueError(f"--target is needed for {env}: the solved threshold is env-specific")
        else:
            task = replace(task, env=env)
    task = replace(
        task,
        target=task.target if target is None else target,
        budget_steps=budget or task.budget_steps,
        eval_every=eval_every or task.eval_every,
    )
    if not 0 < task.eval_every <= task.budget_steps:
        raise ValueError(
            f"--eval-every must be between 1 and the budget ({task.budget_steps:,}), "
            f"got {task.eval_every:,}"
        )
    return task


def sweep(
    ns: Sequence[int], modes: Sequence[Mode], algos: Sequence[Algorithm], *, lone: bool = True
) -> list[Configuration]:
    """The offline reference first, then every mode at every N, N = 1 included unless `lone`
    is False ("pooled" never at N = 1, where it would be offline again). Why skip it: a
    repeat of the groups need not repeat the lone participant's check, a third of the time
    of a LunarLander pair's seed."""
    counts = sorted({1, *ns} if lone else set(ns) - {1})
    configurations = []
    for algo in algos:
        configurations.append(Configuration(1, "offline", algo))
        for mode in modes:
            if mode == "offline" or (algo == "ppo" and mode not in PPO_MODES):
                continue
            configurations.extend(
                Configuration(n, mode, algo) for n in counts if n > 1 or mode != "pooled"
            )
    return configurations


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = Settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=(
            f"a smoke run: CartPole, N = 1 2, offline and both, seeds 0 1, "
            f"{QUICK.budget_steps:,} steps scored every {QUICK.eval_every} (options given win)"
        ),
    )
    parser.add_argument("--task", choices=sorted(TASKS), default="cartpole")
    parser.add_argument("--seeds", type=int, nargs="+", help="run seeds (default 0-4)")
    parser.add_argument(
        "--n",
        type=int,
        nargs="+",
        help="participant counts (default 1 2 4; 1 always runs unless --no-lone)",
    )
    parser.add_argument(
        "--no-lone",
        action="store_true",
        help="groups only: skip N = 1 through the server (the offline reference still runs)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        help="what participants share (default all; the offline reference always runs)",
    )
    parser.add_argument(
        "--algo",
        nargs="+",
        choices=("dqn", "ppo"),
        default=["dqn"],
        help=f"the clients' algorithms (PPO runs only {', '.join(PPO_MODES)})",
    )
    parser.add_argument("--env", help="Gymnasium env id instead of the task's (needs --target)")
    parser.add_argument("--target", type=float, help="solved threshold (default: the task's)")
    parser.add_argument(
        "--budget", type=int, help="env steps per participant (default: the task's)"
    )
    parser.add_argument(
        "--offline-budget",
        type=int,
        help="env steps of the offline reference (default: the participants' budget)",
    )
    parser.add_argument(
        "--eval-every", type=int, help="env steps between marks (default: the task's)"
    )
    parser.add_argument(
        "--eval-episodes",
        type=int,
        default=defaults.eval_episodes,
        help="greedy episodes per score (issue 20 asks for at least 20)",
    )
    parser.add_argument(
        "--sync-interval",
        type=int,
        default=defaults.sync_interval,
        help="local episodes between syncs (default: the client's)",
    )
    parser.add_argument(
        "--sync-steps",
        type=int,
        default=defaults.sync_steps,
        help="env steps between syncs: a round's length, or asynchronously a bound on top of "
        "--sync-interval (default: the client's: 128 in rounds, else 0: episodes only)",
    )
    parser.add_argument(
        "--round-wait-s",
        type=float,
        default=defaults.round_wait_s,
        help="synchronous rounds of --sync-steps env steps, each waiting at most this long for "
        "the version holding its push (default: the client's, 5 s from --rounds-from members "
        "on; 0: asynchronous at any size)",
    )
    parser.add_argument(
        "--rounds-from",
        type=int,
        default=defaults.rounds_from,
        help="members pushing weights from which members sync in rounds, asynchronously "
        "below (default: the client's, 3; 1: rounds at any size)",
    )
    parser.add_argument(
        "--no-shared-warmup",
        dest="shared_warmup",
        action="store_false",
        default=defaults.shared_warmup,
        help="sync as the settings say from the first step, not in rounds until each learner "
        "starts (the client's --no-shared-warmup)",
    )
    parser.add_argument(
        "--foreign-credit",
        type=float,
        default=defaults.foreign_credit,
        help="replay-ratio credit of a received transition (default: the client's)",
    )
    parser.add_argument(
        "--round-foreign-credit",
        type=float,
        default=defaults.round_foreign_credit,
        help="the same while syncing in rounds (default: the client's)",
    )
    parser.add_argument(
        "--pull-transitions",
        type=int,
        default=defaults.pull_transitions,
        help="most of the others' transitions pulled per sync (default: the client's)",
    )
    parser.add_argument(
        "--no-credit-at-own-pace",
        dest="credit_at_own_pace",
        action="store_false",
        default=defaults.credit_at_own_pace,
        help="every received transition earns --foreign-credit, however far its sender ran "
        "ahead (the client's --no-credit-at-own-pace)",
    )
    parser.add_argument(
        "--target-at-adoption",
        default=defaults.target_at_adoption,
        choices=TARGET_AT_ADOPTION,
        help="the target network at adoption (default: the client's)",
    )
    parser.add_argument(
        "--delta-dtype",
        default=defaults.delta_dtype,
        choices=("bfloat16", "float16", "float32"),
        help="wire dtype of weight deltas (default: the client's: float32 in rounds, else "
        "bfloat16)",
    )
    parser.add_argument(
        "--envs-per-participant",
        type=int,
        default=Settings.envs_per_participant,
        help=(
            "envs each participant steps as one batch (default: the engine's; a pooled "
            "learner steps N times as many)"
        ),
    )
    parser.add_argument(
        "--buffer-size", type=int, help="K, updates per version (default: the server's, K = N)"
    )
    parser.add_argument("--server-lr", type=float, help="default: the server's")
    parser.add_argument(
        "--even-pace",
        action="store_true",
        help="no participant steps past another: each as if on a machine of its own, all of "
        "one speed (default: as the OS schedules them)",
    )
    parser.add_argument(
        "--learner",
        nargs="+",
        default=[],
        metavar="NAME=VALUE",
        help=(
            "DQN LearnerConfig fields to change for every participant, the offline one's "
            "too, e.g. target_period_data_exponent=0"
        ),
    )
    parser.add_argument(
        "--work-dir", type=Path, help="where runs write (default: a temp dir, removed)"
    )
    parser.add_argument("--plot", type=Path, default=Path("bench/federation.png"))
    parser.add_argument("--participant", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    try:
        task = resolve_task(
            QUICK if args.quick else TASKS[args.task],
            env=args.env,
            target=args.target,
            budget=args.budget,
            eval_every=args.eval_every,
        )
        learner = tuple(name_value(text) for text in args.learner)
        learner_overrides(LearnerConfig(), learner)
        ExchangeConfig(pull_transitions=args.pull_transitions)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if args.offline_budget is not None and args.offline_budget < task.eval_every:
        raise SystemExit(
            f"--offline-budget ({args.offline_budget:,}) must hold at least one mark "
            f"(every {task.eval_every:,} env steps)"
        )
    if args.envs_per_participant < 1:
        raise SystemExit(
            f"--envs-per-participant must be at least 1, not {args.envs_per_participant}"
        )
    if learner and "ppo" in args.algo:
        raise SystemExit("--learner changes the DQN learner; drop it or --algo ppo")
    settings = Settings(
        env=task.env,
        target=task.target,
        budget_steps=task.budget_steps,
        offline_budget_steps=args.offline_budget,
        eval_every=task.eval_every,
        eval_episodes=args.eval_episodes,
        envs_per_participant=args.envs_per_participant,
        sync_interval=args.sync_interval,
        sync_steps=args.sync_steps,
        round_wait_s=args.round_wait_s,
        rounds_from=args.rounds_from,
        shared_warmup=args.shared_warmup,
        delta_dtype=args.delta_dtype,
        target_at_adoption=args.target_at_adoption,
        foreign_credit=args.foreign_credit,
        round_foreign_credit=args.round_foreign_credit,
        pull_transitions=args.pull_transitions,
        credit_at_own_pace=args.credit_at_own_pace,
        buffer_size=args.buffer_size,
        server_lr=args.server_lr,
        learner=learner,
        even_pace=args.even_pace,
    )
    settings.sync_plan("both", on_policy="ppo" in args.algo)  # refuses rounds that cannot form
    return settings


def settings_from_json(raw: dict[str, Any]) -> Settings:
    """Settings as a participant process receives them: JSON turned the tuples into lists."""
    return Settings(
        **{
            **raw,
            "hidden": tuple(raw["hidden"]),
            "learner": tuple(tuple(pair) for pair in raw["learner"]),
        }
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.participant is not None:
        die_with_parent()
        logging.basicConfig(level=logging.WARNING)
        raw = json.loads(args.participant)
        run_participant(
            ParticipantTask(
                **{
                    **raw,
                    "settings": settings_from_json(raw["settings"]),
                    "pace_follow": tuple(raw["pace_follow"]),
                }
            )
        )
        return
    settings = settings_from(args)
    try:
        # Here, once: a missing extra would otherwise end every participant in a traceback.
        make_vector_env(settings.env, 1).close()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    # Scoring plays batches of a few rows: one thread does them 7x faster than
    # two contending for a loaded core (0.08 against 0.57 ms per forward pass).
    torch.set_num_threads(1)
    # --quick changes the defaults; options given still win.
    quick_modes: tuple[Mode, ...] = ("offline", "both")
    seeds = args.seeds or ([0, 1] if args.quick else list(range(5)))
    ns = args.n or ([1, 2] if args.quick else [1, 2, 4])
    modes = args.modes or (quick_modes if args.quick else MODES)
    if args.no_lone and all(n == 1 for n in ns):
        raise SystemExit("--no-lone leaves nothing to run: give --n with a count above 1")
    configurations = sweep(ns, modes, args.algo, lone=not args.no_lone)
    cores = available_cores()
    load = os.getloadavg()
    print(
        f"{len(configurations)} configurations x {len(seeds)} seeds on {cores} cores "
        f"(load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}); each participant in serial mode "
        f"(one thread); settings: {asdict(settings)}",
        flush=True,
    )
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="fedrl-bench-federation-"))
    results: list[RunResult] = []
    try:
        for seed in seeds:
            for configuration in configurations:
                result = run_configuration(configuration, seed, settings, work_dir)
                results.append(result)
                print(run_line(result), flush=True)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    summaries = summarise(results, cores)
    for line in table_lines(summaries, settings, cores):
        print(line)
    plot(results, args.plot, settings)
    print(f"plot: {args.plot}")
    figures = report(
        results, summaries, settings, cores=cores, seeds=seeds, load=(load[0], os.getloadavg()[0])
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
