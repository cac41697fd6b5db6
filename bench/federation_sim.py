"""Federation without a network: N of the product's engines in one process, in lock step.

bench.federation measures the product end to end, and its figures move
with timing: when a push lands, how far one participant ran ahead of
another, how bursty the others' data arrives. This bench asks the question
underneath — which arrangement of data and weights lets a group learn
faster per participant — with the timing taken out, and with the learner's
own run-to-run spread in view (it runs many seeds cheaply).

What runs. Per seed and arrangement, N TrainingEngines in serial mode
(`workers=0`), all from the same network, take turns: one round each (the
engine's `steps_per_slot` vector steps of every env, then the updates the
replay ratio allows). What an engine collects reaches the others' replays
`--delay` rounds later (0: before their next round) through
TrainingEngine.add_foreign with the client's foreign credit, as the
client's experience sync puts pulled transitions there. No server, no
deltas on the wire, no bfloat16: the rules alone. The arrangements:

- "offline": one engine alone; every invocation runs it, the reference.
  Its engine seeds are participant 0's, so it differs from the others only
  by what they share;
- "experience": every engine learns from its own and everyone's
  transitions, and keeps its own model (the client's --share experience);
- "both": "experience", and every `--every` rounds each engine adopts the
  mean of all models, its target network shifted by the same change
  (Learner.set_weights) — the client's default share without the server's
  asynchrony;
- "roles": engine 0 learns from everyone's transitions; the others only
  act (learn=False) and take its model every `--every` rounds: Ape-X, as
  the client's --role actor arranges it through the server;
- "wide": ONE engine collecting with N times the envs. The ideal the others
  approach: one learner fed by every env, its data never late, its actors
  never behind. Its per-participant env steps are its own divided by N.

What is scored: participant 0's model (both: the mean of all, the model a
global version would hold) at every `--mark` per-participant env steps,
with `--eval-episodes` greedy episodes on evaluation envs of the bench's,
seeded per run seed, so every arrangement of a seed is scored on the same
episode starts. "Reached" is the target at two consecutive marks, as in
bench.federation (its scoring and statistics). Marks should not come more often than
a round of every arrangement: two marks inside one round would score the
same weights twice (a mark of 256 with 16 envs per participant: a round is
128 steps, wide's 128 per participant too).

`--learner NAME=VALUE` changes a LearnerConfig field of every engine, the
offline one's too: whether another learner would let a group gain more is
a question this bench answers cheaply.

The offline reference runs `--offline-budget` env steps (default: the
task's, 12,000 on CartPole), the others `--budget`: a group that should
get there in a fraction of a lone learner's steps needs only that
fraction, and a lone learner cut short has no median to compare with.

Figures per arrangement, over seeds: solved k/seeds, the interquartile
mean of per-participant env steps to target (an unsolved seed counted at
its budget) with its 95 % interval, its speed-up over offline's with its
interval ("no measurable gain" where that holds 1) beside the issue's 0.8·N,
the IQM of the mean score over all marks (how fast it learns even below
the target), gradient updates per own env step, and CPU seconds per
participant (the process's training, scoring left out, divided by N). The
statistics are bench.federation's (docs/federation-benchmark.md). The last
line of stdout is one JSON object with every figure.

Usage (from the repository root):
  .venv/bin/python -m bench.federation_sim --quick
  .venv/bin/python -m bench.federation_sim --arrangements roles wide --n 4 --budget 6000
  .venv/bin/python -m bench.federation_sim --arrangements roles --n 4 --delay 4 --seeds $(seq 0 9)
  .venv/bin/python -m bench.federation_sim --arrangements wide experience --n 2 --budget 8000
  .venv/bin/python -m bench.federation_sim --arrangements wide --n 4 --budget 6000 \\
      --learner lr=5e-4
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from statistics import fmean, median
from typing import Literal

import numpy as np
import torch

from bench.federation.participant import engine_configs, initial_weights, participant_seed
from bench.federation.scoring import evaluator, reached_at
from bench.federation.settings import (
    EXCHANGE,
    QUICK,
    TASKS,
    Settings,
    Task,
    learner_overrides,
    name_value,
)
from bench.federation.statistics import (
    Estimate,
    describe,
    describe_speedup,
    iqm_interval,
    ratio_interval,
)
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.evaluation import Scorer
from fedrl.client.training.learner_config import TARGET_AT_ADOPTION, LearnerConfig, TargetAtAdoption
from fedrl.client.training.transitions import LearnerTransitions

Arrangement = Literal["offline", "experience", "both", "roles", "wide"]
ARRANGEMENTS: tuple[Arrangement, ...] = ("offline", "experience", "both", "roles", "wide")
QUICK_ARRANGEMENTS: tuple[Arrangement, ...] = ("both", "wide")
Weights = list[tuple[str, np.ndarray]]


@dataclass(frozen=True)
class SimSettings:
    """What every run of one invocation shares."""

    task: Task = TASKS["cartpole"]
    """The task: env, target, budget and marks."""
    n: int = 2
    """Participants (wide: N times one participant's envs)."""
    delay: int = 0
    """Rounds before a participant's transitions reach the others (0: their next round)."""
    every: int = 1
    """Rounds between model averaging (both) or the learner's model reaching the actors (roles)."""
    target_at_adoption: TargetAtAdoption = "shift"
    """What an adopting learner's target network does (both)."""
    foreign_credit: float = EXCHANGE.foreign_credit
    """Replay-ratio credit of a received transition (the client's default)."""
    offline_budget: int | None = None
    """Env steps of the offline reference; None: the task's budget. A lone learner needs more
    steps than a group, and its median must be a number for the speed-ups to be."""
    eval_episodes: int = 20
    """Greedy episodes per score."""
    envs_per_participant: int = 16
    """Envs each participant steps as one batch (the engine's default)."""
    learner: tuple[tuple[str, str], ...] = ()
    """LearnerConfig fields changed from the defaults, as (name, value) text (--learner)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if self.delay < 0 or self.every < 1:
            raise ValueError(f"delay must be >= 0 and every >= 1, got {self.delay}, {self.every}")
        for name, budget in (
            ("budget", self.task.budget_steps),
            ("offline budget", self.offline_budget),
        ):
            if budget is not None and budget < self.task.eval_every:
                raise ValueError(
                    f"the {name} ({budget}) must hold at least one mark "
                    f"(every {self.task.eval_every} env steps)"
                )
        if self.target_at_adoption not in TARGET_AT_ADOPTION:
            raise ValueError(f"target_at_adoption must be one of {TARGET_AT_ADOPTION}")
        learner_overrides(LearnerConfig(), self.learner)

    def marks(self, arrangement: Arrangement) -> list[int]:
        """Per-participant env steps at which a run of `arrangement` is scored."""
        budget = self.task.budget_steps
        if arrangement == "offline" and self.offline_budget is not None:
            budget = self.offline_budget
        return list(range(self.task.eval_every, budget + 1, self.task.eval_every))


@dataclass(frozen=True)
class SimRun:
    """One arrangement on one seed."""

    arrangement: Arrangement
    n: int
    seed: int
    returns: list[float]
    """Score at every mark."""
    budget: int
    """Per-participant env steps of its last mark: where an unsolved seed is counted."""
    reached: int | None
    """Per-participant env steps to target (the first of two marks), None if never."""
    updates_per_step: float
    """Gradient updates per own env step, mean over participants."""
    cpu_seconds: float
    """CPU seconds per participant."""
    foreign_received: int
    """Transitions that reached participant 0's replay from the others."""

    def steps_or(self, unsolved: int) -> int:
        """Steps to target, an unsolved run counted at `unsolved` (its budget or more)."""
        return unsolved if self.reached is None else self.reached


class Exchange:
    """Each participant's transitions, delivered to every other learner `delay` rounds later."""

    def __init__(self, learners: Sequence[bool], delay: int) -> None:
        self._learners = list(learners)
        self._delay = delay
        self._queues: list[deque[tuple[int, LearnerTransitions]]] = [
            deque() for _ in self._learners
        ]
        self.round_index = 0
        """The round being played; the caller advances it."""

    def send(self, sender: int, batch: LearnerTransitions) -> None:
        arrives = self.round_index + 1 + self._delay
        for receiver, learns in enumerate(self._learners):
            if receiver != sender and learns:
                self._queues[receiver].append((arrives, batch))

    def due(self, receiver: int) -> Iterator[LearnerTransitions]:
        """The batches that reach `receiver` before it plays this round, oldest first."""
        queue = self._queues[receiver]
        while queue and queue[0][0] <= self.round_index:
            yield queue.popleft()[1]


def mean_weights(models: Sequence[Weights]) -> Weights:
    return [
        (name, np.mean([model[k][1] for model in models], axis=0))
        for k, (name, _) in enumerate(models[0])
    ]


def run(arrangement: Arrangement, seed: int, settings: SimSettings) -> SimRun:
    """Train one arrangement in lock step; score it at every mark."""
    n = 1 if arrangement in ("offline", "wide") else settings.n
    per_participant = settings.n if arrangement == "wide" else 1
    bench_settings = replace(
        Settings(),
        env=settings.task.env,
        envs_per_participant=settings.envs_per_participant * per_participant,
        learner=settings.learner,
    )
    learns = [arrangement != "roles" or index == 0 for index in range(n)]
    engines: list[TrainingEngine] = []
    for index in range(n):
        engine_config, learner = engine_configs(bench_settings, participant_seed(seed, index))
        engines.append(TrainingEngine(engine_config, learner, learn=learns[index]))
    initial = initial_weights(bench_settings, seed, "dqn")
    exchange = Exchange(learns, settings.delay)
    for index, engine in enumerate(engines):
        engine.set_weights(initial, target="reset")
        if arrangement in ("experience", "both", "roles"):
            engine.on_batch(functools.partial(exchange.send, index))
        engine.start()
    # A network of its own: Scorer loads each scored model into it.
    scorer = Scorer(
        copy.deepcopy(engines[0].learner.online),
        evaluator(settings.task.env, settings.eval_episodes, seed),
    )
    marks = iter(settings.marks(arrangement))
    next_mark = next(marks, None)
    returns: list[float] = []
    cpu_start = time.process_time()
    scoring_cpu = 0.0
    try:
        while next_mark is not None:
            for index, engine in enumerate(engines):
                for batch in exchange.due(index):
                    engine.add_foreign(batch, credit=settings.foreign_credit)
                engine.poll()
            exchange.round_index += 1
            if exchange.round_index % settings.every == 0:
                _share_models(arrangement, engines, settings.target_at_adoption)
            steps = engines[0].counters.env_steps // per_participant
            while next_mark is not None and steps >= next_mark:
                model = (
                    mean_weights([e.weights() for e in engines])
                    if arrangement == "both"
                    else engines[0].weights()
                )
                scoring_start = time.process_time()
                returns.append(scorer.score(model).mean)
                scoring_cpu += time.process_time() - scoring_start
                # A LunarLander four runs for minutes a seed: show each score as it comes.
                print(
                    f"  {arrangement} seed {seed}: {next_mark:,} steps/participant, "
                    f"score {returns[-1]:.0f}",
                    file=sys.stderr,
                    flush=True,
                )
                next_mark = next(marks, None)
        # Training's CPU only, as bench.federation counts it: scoring is the bench's.
        cpu = (time.process_time() - cpu_start - scoring_cpu) / (n * per_participant)
        updates = [e.learner.updates / e.counters.env_steps for e in engines]
        received = engines[0].foreign_received
    finally:
        scorer.close()
        for engine in engines:
            engine.close()
    first = reached_at(returns, settings.task.target)
    scored_at = settings.marks(arrangement)
    return SimRun(
        arrangement=arrangement,
        n=settings.n if arrangement != "offline" else 1,
        seed=seed,
        returns=returns,
        budget=scored_at[-1],
        reached=None if first is None else scored_at[first],
        updates_per_step=fmean(updates),
        cpu_seconds=cpu,
        foreign_received=received,
    )


def _share_models(
    arrangement: Arrangement, engines: Sequence[TrainingEngine], target: TargetAtAdoption
) -> None:
    if arrangement == "both":
        mean = mean_weights([e.weights() for e in engines])
        for engine in engines:
            engine.set_weights(mean, target=target)
    elif arrangement == "roles":
        model = engines[0].weights()
        for actor in engines[1:]:
            actor.set_weights(model, target="reset")


@dataclass(frozen=True)
class SimSummary:
    """One arrangement over its seeds."""

    arrangement: Arrangement
    n: int
    solved: int
    seeds: int
    steps: Estimate
    """IQM of per-participant env steps to target, unsolved seeds at the budget."""
    speedup: Estimate | None
    """Offline's IQM steps over this one's (None for offline itself, or without it)."""
    mean_score: Estimate
    """IQM of the mean score over the marks."""
    updates_per_step: float
    cpu_seconds: float


def summarise(runs: Sequence[SimRun]) -> list[SimSummary]:
    """One row per arrangement, in ARRANGEMENTS order; speed-ups against offline's IQM. An
    unsolved seed counts at its budget, a group's at offline's where that is longer: a group
    that stops sooner gains nothing by stopping (as in bench.federation)."""
    by_arrangement: dict[Arrangement, list[SimRun]] = {}
    for r in runs:
        by_arrangement.setdefault(r.arrangement, []).append(r)
    offline_runs = by_arrangement.get("offline", [])
    offline = [r.steps_or(r.budget) for r in offline_runs]
    longest_offline = max((r.budget for r in offline_runs), default=0)
    rows = []
    for arrangement in ARRANGEMENTS:
        group = by_arrangement.get(arrangement)
        if not group:
            continue
        steps = [r.steps_or(max(r.budget, longest_offline)) for r in group]
        rows.append(
            SimSummary(
                arrangement=arrangement,
                n=group[0].n,
                solved=sum(r.reached is not None for r in group),
                seeds=len(group),
                steps=iqm_interval(steps),
                speedup=(
                    ratio_interval(offline, steps) if offline and arrangement != "offline" else None
                ),
                mean_score=iqm_interval([fmean(r.returns) for r in group]),
                updates_per_step=median(r.updates_per_step for r in group),
                cpu_seconds=median(r.cpu_seconds for r in group),
            )
        )
    return rows


def run_line(r: SimRun) -> str:
    reached = "-" if r.reached is None else f"{r.reached:,}"
    curve = " ".join(f"{v:.0f}" for v in r.returns)
    return (
        f"{r.arrangement} N={r.n} seed {r.seed}: target at {reached} steps/participant; "
        f"{r.updates_per_step:.2f} updates/step, {r.cpu_seconds:.1f} CPU s/participant, "
        f"{r.foreign_received:,} foreign transitions to p0; curve: {curve}"
    )


def table_lines(rows: Sequence[SimSummary]) -> Iterator[str]:
    yield (
        f"{'arrangement':<16}{'solved':>7}{'IQM steps/p [95% CI]':>28}{'IQM mean score':>20}"
        f"{'upd/step':>9}{'CPU s/p':>8}  speed-up vs offline (0.8·N)"
    )
    for row in rows:
        speedup = "-" if row.speedup is None else describe_speedup(row.speedup)
        goal = "" if row.arrangement == "offline" else f" ({0.8 * row.n:.1f})"
        yield (
            f"{row.arrangement + ' N=' + str(row.n):<16}{f'{row.solved}/{row.seeds}':>7}"
            f"{describe(row.steps):>28}{describe(row.mean_score):>20}"
            f"{row.updates_per_step:>9.2f}{row.cpu_seconds:>8.1f}  {speedup}{goal}"
        )
    yield (
        "IQM: interquartile mean over seeds, an unsolved seed counted at its budget; [95% CI]: "
        "stratified percentile bootstrap over seeds (docs/federation-benchmark.md)"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.federation_sim", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: CartPole, N = 2, both and wide, seeds 0 1, {QUICK.budget_steps:,} "
        f"steps scored every {QUICK.eval_every} (options given win)",
    )
    parser.add_argument("--task", choices=sorted(TASKS), default="cartpole")
    parser.add_argument(
        "--arrangements",
        nargs="*",
        choices=[a for a in ARRANGEMENTS if a != "offline"],
        help="arrangements beside offline, which always runs (default: all; --quick: both wide)",
    )
    parser.add_argument("--n", type=int, default=2, help="participants")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the task's (0-9 CartPole)")
    parser.add_argument("--budget", type=int, help="env steps per participant (task's default)")
    parser.add_argument(
        "--offline-budget", type=int, help="env steps of the offline reference (task's default)"
    )
    parser.add_argument("--mark", type=int, help="env steps between scores (task's default)")
    parser.add_argument("--delay", type=int, default=SimSettings.delay)
    parser.add_argument("--every", type=int, default=SimSettings.every)
    parser.add_argument(
        "--target-at-adoption", choices=TARGET_AT_ADOPTION, default=SimSettings.target_at_adoption
    )
    parser.add_argument("--foreign-credit", type=float, default=SimSettings.foreign_credit)
    parser.add_argument("--eval-episodes", type=int, default=SimSettings.eval_episodes)
    parser.add_argument(
        "--learner",
        nargs="+",
        default=[],
        metavar="NAME=VALUE",
        help="LearnerConfig fields to change for every engine, e.g. lr=5e-4",
    )
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> SimSettings:
    task = QUICK if args.quick else TASKS[args.task]
    task = replace(
        task,
        budget_steps=args.budget or task.budget_steps,
        eval_every=args.mark or task.eval_every,
    )
    return SimSettings(
        task=task,
        n=args.n,
        delay=args.delay,
        every=args.every,
        offline_budget=args.offline_budget,
        target_at_adoption=args.target_at_adoption,
        foreign_credit=args.foreign_credit,
        eval_episodes=args.eval_episodes,
        learner=tuple(name_value(text) for text in args.learner),
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        settings = settings_from(args)
    except ValueError as exc:
        sys.exit(f"federation_sim: {exc}")
    torch.set_num_threads(1)
    chosen = args.arrangements
    if chosen is None:
        chosen = QUICK_ARRANGEMENTS if args.quick else ARRANGEMENTS[1:]
    arrangements: list[Arrangement] = ["offline", *chosen]
    seeds = args.seeds or list(range(settings.task.seeds))
    described = {**asdict(settings), "task": asdict(settings.task)}
    print(f"{len(arrangements)} arrangements x seeds {seeds}; settings: {described}")
    runs: list[SimRun] = []
    for seed in seeds:
        for arrangement in arrangements:
            result = run(arrangement, seed, settings)
            runs.append(result)
            print(run_line(result), flush=True)
    rows = summarise(runs)
    print()
    for line in table_lines(rows):
        print(line)
    figures = {
        "settings": described,
        "seeds": seeds,
        "summaries": [asdict(r) for r in rows],
        "runs": [asdict(r) for r in runs],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
