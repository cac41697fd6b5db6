"""The command line: `python -m bench.federation [options]` (docs/federation-benchmark.md).

Usage (from the repository root):
  .venv/bin/python -m bench.federation --quick
  .venv/bin/python -m bench.federation --n 2 4 --modes both             # CartPole, seeds 0-9
  .venv/bin/python -m bench.federation --task lunarlander --n 2 4 --modes both --budget 48000
The last line of stdout is one JSON object with every figure; a PNG of the
score against per-participant env steps goes to --plot.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from bench.federation.matching import MatchingError
from bench.federation.plot import plot
from bench.federation.report import figures, run_line, table_lines
from bench.federation.results import RunResult
from bench.federation.runner import run_configuration
from bench.federation.settings import (
    GROUP_MODES,
    PPO_MODES,
    QUICK,
    TASKS,
    Configuration,
    Mode,
    Settings,
    Task,
    group_configurations,
    learner_overrides,
    name_value,
    resolve_task,
)
from bench.federation.summary import compare
from bench.federation.sweep import Sweep
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.training.engine_config import available_cores
from fedrl.client.training.learner_config import TARGET_AT_ADOPTION, LearnerConfig
from fedrl.client.training.vector_env import make_vector_env
from fedrl.common.group_rules import ROUNDS_FROM

QUICK_MODES: tuple[Mode, ...] = ("both",)
NUMBERS: tuple[tuple[str, type, str], ...] = (
    ("eval_episodes", int, "greedy episodes per score"),
    (
        "envs_per_participant",
        int,
        "envs each participant steps as one batch (default: the engine's; a pooled learner "
        "steps N times as many)",
    ),
    ("sync_interval", int, "local episodes between syncs (default: the client's)"),
    (
        "sync_steps",
        int,
        "env steps between syncs: a round's length, or asynchronously a bound on top of "
        "--sync-interval (default: the client's: 128 in rounds, else 0: episodes only)",
    ),
    (
        "round_wait_s",
        float,
        "synchronous rounds of --sync-steps env steps, each waiting at most this long for the "
        "version holding its push (default: the client's, 5 s from --rounds-from members on; "
        "0: asynchronous at any size)",
    ),
    (
        "rounds_from",
        int,
        "members pushing weights from which members sync in rounds, asynchronously below "
        f"(default: the client's, {ROUNDS_FROM}; 1: rounds at any size)",
    ),
    (
        "foreign_credit",
        float,
        "replay-ratio credit of a received transition (default: the client's)",
    ),
    ("round_foreign_credit", float, "the same while syncing in rounds (default: the client's)"),
    (
        "pull_transitions",
        int,
        "most of the others' transitions pulled per sync (default: the client's)",
    ),
    ("buffer_size", int, "K, updates per version (default: the server's, K = N)"),
    ("server_lr", float, "the server learning rate (default: the server's)"),
)
"""Settings given as one number each on the command line: (field, type, help)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog="python -m bench.federation",
        description=(
            "Per-participant env steps to a solved model: N participants through a real server "
            "against a lone learner at the defaults, a lone learner with the group's compute "
            "and a pooled learner (docs/federation-benchmark.md)."
        ),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=(
            f"a smoke run: CartPole, N = 1 2, mode both, seeds 0 1, {QUICK.budget_steps:,} steps "
            f"scored every {QUICK.eval_every} (options given win)"
        ),
    )
    parser.add_argument("--task", choices=sorted(TASKS), default="cartpole")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        help="run seeds, the same for every arrangement (default: the task's, CartPole 0-9, "
        "LunarLander 0-4; --quick 0 1)",
    )
    parser.add_argument(
        "--n",
        type=int,
        nargs="+",
        help="participant counts (default 1 2 4; 1 always runs unless --no-lone)",
    )
    parser.add_argument(
        "--no-lone",
        action="store_true",
        help="groups only: skip N = 1 through the server (the lone references still run)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=GROUP_MODES,
        help="what participants share (default all; the references run beside each)",
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
        help="env steps of the lone references (default: the participants' budget)",
    )
    parser.add_argument(
        "--eval-every", type=int, help="env steps between marks (default: the task's)"
    )
    for name, kind, text in NUMBERS:
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=kind, default=getattr(defaults, name), help=text)
    parser.add_argument(
        "--no-shared-warmup",
        dest="shared_warmup",
        action="store_false",
        default=defaults.shared_warmup,
        help="sync as the settings say from the first step, not in rounds until each learner "
        "starts (the client's --no-shared-warmup)",
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
            "DQN LearnerConfig fields to change for every learner, the references' too, "
            "e.g. target_period_data_exponent=0"
        ),
    )
    parser.add_argument(
        "--work-dir", type=Path, help="where runs write (default: a temp dir, removed)"
    )
    parser.add_argument("--plot", type=Path, default=Path("bench/federation.png"))
    return parser.parse_args(argv)


def task_from(args: argparse.Namespace) -> Task:
    """The task the options name, with the figures they change."""
    return resolve_task(
        QUICK if args.quick else TASKS[args.task],
        env=args.env,
        target=args.target,
        budget=args.budget,
        eval_every=args.eval_every,
    )


def settings_from(args: argparse.Namespace) -> Settings:
    try:
        task = task_from(args)
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
        shared_warmup=args.shared_warmup,
        delta_dtype=args.delta_dtype,
        target_at_adoption=args.target_at_adoption,
        credit_at_own_pace=args.credit_at_own_pace,
        learner=learner,
        even_pace=args.even_pace,
        **{name: getattr(args, name) for name, _, _ in NUMBERS},
    )
    settings.sync_plan("both", on_policy="ppo" in args.algo)  # refuses rounds that cannot form
    return settings


def seeds_from(args: argparse.Namespace) -> list[int]:
    """The seeds the options give, or the task's default count from 0; every arrangement runs
    all of them."""
    seeds = list(args.seeds) if args.seeds else list(range(task_from(args).seeds))
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds must be distinct, got {seeds}")
    return seeds


def groups_from(args: argparse.Namespace) -> list[Configuration]:
    """The group configurations the options name (--quick: both, N = 1 2)."""
    ns = args.n or ([1, 2] if args.quick else [1, 2, 4])
    if any(n < 1 for n in ns):
        raise SystemExit(f"--n takes participant counts of at least 1, got {ns}")
    if args.no_lone and all(n == 1 for n in ns):
        raise SystemExit("--no-lone leaves nothing to run: give --n with a count above 1")
    modes = args.modes or (QUICK_MODES if args.quick else GROUP_MODES)
    groups = group_configurations(ns, modes, args.algo, lone=not args.no_lone)
    if not groups:
        raise SystemExit(f"--algo ppo runs only the modes {', '.join(PPO_MODES)}")
    return groups


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    settings = settings_from(args)
    seeds = seeds_from(args)
    groups = groups_from(args)
    try:
        # Here, once: a missing extra would otherwise end every participant in a traceback.
        make_vector_env(settings.env, 1).close()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    # Scoring plays batches of a few rows: one thread does them 7x faster than
    # two contending for a loaded core (0.08 against 0.57 ms per forward pass).
    torch.set_num_threads(1)
    cores = available_cores()
    load = os.getloadavg()
    print(
        f"{len(groups)} group configurations and their references x {len(seeds)} seeds "
        f"({' '.join(map(str, seeds))}) on {cores} cores (load {load[0]:.1f}/{load[1]:.1f}/"
        f"{load[2]:.1f}); each participant in serial mode (one thread); settings: "
        f"{settings}",
        flush=True,
    )
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="fedrl-bench-federation-"))
    results: list[RunResult] = []

    def run_one(configuration: Configuration, seed: int) -> RunResult:
        result = run_configuration(configuration, seed, settings, work_dir)
        results.append(result)
        print(run_line(result), flush=True)
        return result

    sweep = Sweep(run_one, seeds, settings, say=lambda line: print(line, flush=True))
    try:
        measured = [sweep.measure(group) for group in groups]
    except MatchingError as exc:
        raise SystemExit(str(exc)) from None
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    comparisons = [compare(m) for m in measured]
    for line in table_lines(comparisons, settings, seeds, cores):
        print(line)
    plot(measured, args.plot, settings)
    print(f"plot: {args.plot}")
    every = figures(
        comparisons,
        results,
        settings,
        seeds=seeds,
        cores=cores,
        load=(load[0], os.getloadavg()[0]),
    )
    print(json.dumps(every))
