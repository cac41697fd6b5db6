"""Self-play alone and in a group: win rates against the fixed players and rating, by env steps.

What runs. Per seed, two configurations of the real commands:

- "alone": one `fedrl-client --offline` participant;
- "group": a `fedrl-server` on loopback (fedrl.server.launcher) and
  `--group` participants of one session, `fedrl-client --server ...` with
  the client's defaults (sharing weights and experience); each draws its
  opponents from its own league, which the session's versions join.

Participant i of a seed trains with engine seed 1000·seed + i, so the lone
participant of a seed is the group's participant 0 but for federating.
Every participant stops at `--max-env-steps` of its own or at
`--time-limit-s` (SIGTERM: it saves and, in a group, pushes what is left).
The configurations of all seeds run at once with `--parallel`, else one
after another.

What is measured. Each participant's own evaluations (the client's: every
`--eval-interval` of its env steps, `--eval-episodes` greedy games against
each fixed player from each seat, with its Elo) from its metrics.jsonl;
its learner updates per own env step (from its train records); and its CPU
seconds, its actors' included (the rusage of the client process, which
joins its actors). The target (`--target`): connect four, at least 95 %
wins against the random player over both seats and at least 60 %
non-losses against the look-ahead player in each seat; tic-tac-toe, no
loss against the look-ahead player in either seat. A participant's steps
to target are its env steps at the first of two evaluations in a row that
meet it (one lucky evaluation of a wobbling policy does not count); a group
run's are the median over its participants. The summary gives, per
configuration, the median over seeds of the steps to target (none unless
at least half the seeds reach it), and the group's against the lone
participant's, with the compute of each side beside it.

The last line of stdout is one JSON object with those figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from fedrl.server.launcher import ServerProcess

CLIENT = Path(sys.executable).with_name("fedrl-client")
CONSECUTIVE = 2
"""Evaluations in a row that must meet the target."""
SERVER_OPTIONS = (
    # The runs end by their own budget, never by the session's goal.
    "--goal-episodes",
    "1000000000",
    "--no-dashboard",
    # Games are short: early syncs come faster than the default limit of 2 pushes/s, which
    # would pace versions by wall clock instead of by the sync interval.
    "--push-rate-per-s",
    "1000",
    "--push-burst",
    "1000",
)


@dataclass(frozen=True)
class Evaluation:
    """One of a participant's evaluations: its rates against the fixed players, and its Elo."""

    env_steps: int
    rates: dict[str, float]
    rating: float | None

    def random_wins(self) -> float:
        return (self.rates["random_first_win"] + self.rates["random_second_win"]) / 2

    def lookahead_non_losses(self) -> tuple[float, float]:
        return 1 - self.rates["lookahead_first_loss"], 1 - self.rates["lookahead_second_loss"]


def meets(target: str, evaluation: Evaluation) -> bool:
    """Whether an evaluation meets the game's target (module docstring)."""
    first, second = evaluation.lookahead_non_losses()
    if target == "connect_four":
        return evaluation.random_wins() >= 0.95 and min(first, second) >= 0.6
    return min(first, second) >= 1.0


def steps_to_target(target: str, evaluations: Sequence[Evaluation]) -> int | None:
    """Env steps at the first of CONSECUTIVE evaluations in a row meeting `target`; None if
    none do (the rule of bench.federation.scoring.reached_at, which this script cannot import:
    bench's packages are not on a script's path)."""
    run = 0
    for index, evaluation in enumerate(evaluations):
        run = run + 1 if meets(target, evaluation) else 0
        if run == CONSECUTIVE:
            return evaluations[index - CONSECUTIVE + 1].env_steps
    return None


@dataclass
class ParticipantRun:
    """What one participant did."""

    name: str
    engine_seed: int
    env_steps: int = 0
    updates: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    evaluations: list[Evaluation] = field(default_factory=list)
    steps_to_target: int | None = None
    exit_code: int | None = None

    @property
    def updates_per_step(self) -> float | None:
        return self.updates / self.env_steps if self.env_steps else None


@dataclass
class ConfigurationRun:
    """One configuration of one seed: its participants."""

    configuration: str
    seed: int
    participants: list[ParticipantRun]

    @property
    def steps_to_target(self) -> float | None:
        """The median over participants; None unless at least half reach the target."""
        return median_of_reached([p.steps_to_target for p in self.participants])


def median_of_reached(values: Sequence[float | None]) -> float | None:
    """The median counting a miss as never reaching; None where that median is a miss."""
    if not values:
        return None
    middle = statistics.median(float("inf") if v is None else v for v in values)
    return None if middle == float("inf") else float(middle)


def read_metrics(path: Path) -> tuple[list[Evaluation], int, int]:
    """A participant's evaluations, and its last env steps and updates."""
    evaluations: list[Evaluation] = []
    env_steps = updates = 0
    if not path.exists():
        return evaluations, env_steps, updates
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        env_steps = max(env_steps, int(record.get("env_steps", 0)))
        updates = max(updates, int(record.get("updates", 0)))
        if record["kind"] == "eval" and "random_first_win" in record:
            rates = {
                k: float(v) for k, v in record.items() if k.startswith(("random_", "lookahead_"))
            }
            evaluations.append(Evaluation(int(record["env_steps"]), rates, record.get("rating")))
    return evaluations, env_steps, updates


class Client:
    """One `fedrl-client` process, stopped by SIGTERM at the time limit, its rusage kept."""

    def __init__(self, args: list[str], log: Path) -> None:
        self._log = log.open("w", encoding="utf-8")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [str(CLIENT), *args], stdout=self._log, stderr=subprocess.STDOUT
        )
        self.cpu_s = 0.0
        self.exit_code: int | None = None
        self.wall_s = 0.0

    def wait(self, deadline: float) -> None:
        """Until it exits, or SIGTERM at `deadline` and then until it exits; its rusage."""
        pid = self.process.pid
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() >= deadline:
                self.process.send_signal(signal.SIGTERM)
                _, status, usage = os.wait4(pid, 0)
                break
            time.sleep(0.5)
        # Reaped here (with its rusage), so Popen must not wait for it again.
        self.process.returncode = self.exit_code = os.waitstatus_to_exitcode(status)
        self.cpu_s = usage.ru_utime + usage.ru_stime
        self.wall_s = time.monotonic() - self.started
        self._log.close()


def client_args(args: argparse.Namespace, name: str, seed: int, state: Path) -> list[str]:
    return [
        "--participant-id",
        name,
        "--env",
        f"pettingzoo/{args.game}",
        "--seed",
        str(seed),
        "--workers",
        str(args.workers),
        "--episodes",
        "1000000000",
        "--max-env-steps",
        str(args.max_env_steps),
        "--eval-interval",
        str(args.eval_interval),
        "--eval-episodes",
        str(args.eval_episodes),
        "--state-dir",
        str(state),
        "--log-interval",
        "60",
        "--tensorboard",
        "off",
        *args.client_option,
    ]


def run_configuration(
    args: argparse.Namespace, configuration: str, seed: int, root: Path
) -> ConfigurationRun:
    """One configuration of one seed, to its budget; its participants' figures."""
    where = root / f"{configuration}-{seed}"
    where.mkdir(parents=True)
    size = 1 if configuration == "alone" else args.group
    names = [f"{configuration}-{seed}-{i}" for i in range(size)]
    seeds = [1000 * seed + i for i in range(size)]
    server: ServerProcess | None = None
    if configuration == "group":
        server = ServerProcess(where / "server", *SERVER_OPTIONS, log=where / "server.log")
        server.start()
    try:
        clients = []
        for name, engine_seed in zip(names, seeds, strict=True):
            place = ["--offline"] if server is None else ["--server", server.address]
            clients.append(
                Client(
                    [*place, *client_args(args, name, engine_seed, where / "state")],
                    where / f"{name}.log",
                )
            )
        deadline = time.monotonic() + args.time_limit_s
        for client in clients:
            client.wait(deadline)
    finally:
        if server is not None:
            server.stop()
    runs = []
    for name, engine_seed, client in zip(names, seeds, clients, strict=True):
        evaluations, env_steps, updates = read_metrics(where / "state" / name / "metrics.jsonl")
        reached = steps_to_target(args.target, evaluations)
        runs.append(
            ParticipantRun(
                name=name,
                engine_seed=engine_seed,
                env_steps=env_steps,
                updates=updates,
                cpu_s=client.cpu_s,
                wall_s=client.wall_s,
                evaluations=evaluations,
                steps_to_target=reached,
                exit_code=client.exit_code,
            )
        )
    return ConfigurationRun(configuration, seed, runs)


def summary(runs: Sequence[ConfigurationRun], configuration: str) -> dict[str, Any]:
    chosen = [r for r in runs if r.configuration == configuration]
    participants = [p for r in chosen for p in r.participants]
    per_step = [p.updates_per_step for p in participants if p.updates_per_step is not None]
    return {
        "runs": len(chosen),
        "reached": sum(r.steps_to_target is not None for r in chosen),
        "median_steps_to_target": median_of_reached([r.steps_to_target for r in chosen]),
        "median_env_steps": statistics.median(p.env_steps for p in participants),
        "median_cpu_s_per_participant": statistics.median(p.cpu_s for p in participants),
        "median_updates_per_own_env_step": statistics.median(per_step) if per_step else None,
        "median_cpu_ms_per_env_step": statistics.median(
            1000 * p.cpu_s / p.env_steps for p in participants if p.env_steps
        ),
    }


def run_line(run: ConfigurationRun) -> str:
    parts = []
    for p in run.participants:
        last = p.evaluations[-1] if p.evaluations else None
        shown = "-"
        if last is not None:
            first, second = last.lookahead_non_losses()
            shown = (
                f"random wins {last.random_wins():.2f}, lookahead non-losses "
                f"{first:.2f}/{second:.2f}, elo {last.rating or 0:.0f}"
            )
        parts.append(
            f"  {p.name:<14} steps {p.env_steps:>8}  to target {p.steps_to_target or '-':>8}  "
            f"updates/step {p.updates_per_step or 0:.2f}  cpu {p.cpu_s:7.0f} s  "
            f"wall {p.wall_s:6.0f} s  exit {p.exit_code}  last eval: {shown}"
        )
    return f"{run.configuration} seed {run.seed}\n" + "\n".join(parts)


def curve_lines(runs: Sequence[ConfigurationRun], configuration: str) -> list[str]:
    """Median rating and rates over this configuration's participants, by evaluation mark."""
    marks: dict[int, list[Evaluation]] = {}
    for run in runs:
        if run.configuration != configuration:
            continue
        for p in run.participants:
            for e in p.evaluations:
                marks.setdefault(e.env_steps // 1000, []).append(e)
    lines = []
    for mark in sorted(marks):
        got = marks[mark]
        ratings = [e.rating for e in got if e.rating is not None]
        lines.append(
            f"  {configuration:<6} ~{mark}k steps  random wins "
            f"{statistics.median(e.random_wins() for e in got):.2f}  lookahead non-losses "
            f"{statistics.median(min(e.lookahead_non_losses()) for e in got):.2f} (worse seat)  "
            f"elo {statistics.median(ratings) if ratings else 0:.0f}  ({len(got)} evals)"
        )
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--game", default="connect_four_v3", choices=["connect_four_v3", "tictactoe_v3"]
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--group", type=int, default=2, help="participants of a group")
    parser.add_argument("--max-env-steps", type=int, default=1_000_000)
    parser.add_argument("--time-limit-s", type=float, default=1800.0)
    parser.add_argument("--eval-interval", type=int, default=10_000)
    parser.add_argument("--eval-episodes", type=int, default=50)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--configurations", default="alone,group")
    parser.add_argument("--parallel", action="store_true", help="run every run at once")
    parser.add_argument(
        "--client-option",
        action="append",
        default=[],
        help="one more fedrl-client argument for every participant (repeat it)",
    )
    parser.add_argument("--out", type=Path, default=None, help="keep the runs' files here")
    args = parser.parse_args(argv)
    args.target = "connect_four" if args.game == "connect_four_v3" else "tictactoe"
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    configurations = args.configurations.split(",")
    root = args.out or Path(tempfile.mkdtemp(prefix="fedrl-self-play-"))
    root.mkdir(parents=True, exist_ok=True)
    jobs = [(c, s) for s in seeds for c in configurations]
    print(
        f"self-play bench: {args.game}, seeds {seeds}, {configurations}, group of {args.group}, "
        f"{args.workers} actor worker(s) each, budget {args.max_env_steps} env steps or "
        f"{args.time_limit_s:.0f} s; cores {psutil.cpu_count()}, load at start "
        f"{os.getloadavg()[0]:.1f}; files in {root}",
        flush=True,
    )
    runs: list[ConfigurationRun] = []
    if args.parallel:
        done: dict[tuple[str, int], ConfigurationRun] = {}

        def job(configuration: str, seed: int) -> None:
            done[configuration, seed] = run_configuration(args, configuration, seed, root)

        threads = [threading.Thread(target=job, args=j) for j in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        runs = [done[j] for j in jobs]
    else:
        runs = [run_configuration(args, c, s, root) for c, s in jobs]
    for run in runs:
        print(run_line(run), flush=True)
    for configuration in configurations:
        print("\n".join(curve_lines(runs, configuration)))
    result: dict[str, Any] = {
        "bench": "self_play",
        "game": args.game,
        "target": args.target,
        "seeds": seeds,
        "group": args.group,
        "load_at_end": round(os.getloadavg()[0], 1),
        "cores": psutil.cpu_count(),
        "configurations": {c: summary(runs, c) for c in configurations},
        "runs": [
            {
                "configuration": r.configuration,
                "seed": r.seed,
                "participants": [
                    {k: v for k, v in asdict(p).items() if k != "evaluations"}
                    for p in r.participants
                ],
            }
            for r in runs
        ],
    }
    alone = result["configurations"].get("alone", {}).get("median_steps_to_target")
    group = result["configurations"].get("group", {}).get("median_steps_to_target")
    result["group_steps_over_alone"] = group / alone if alone and group else None
    print(
        f"steps to target, median over seeds: alone {alone or 'not reached'}, group of "
        f"{args.group} {group or 'not reached'} (each participant's own env steps)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
