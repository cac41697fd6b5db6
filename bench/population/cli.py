"""`python -m bench.population`: populations against independent runs and the defaults, in one go.

What runs: bench.population.settings; what is computed: bench.population.report.
Every finished job appends its members' figures to --results (JSON lines),
and a later invocation with the same file and options skips the jobs already
there, so a long bench survives an interruption. Each line names the commit
and the settings it ran with; a file from another commit, a changed tree or
other settings is refused rather than mixed into one table. The last line of stdout is
one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.population.report import arms, per_seed_lines, summary, summary_lines
from bench.population.runs import Job, MemberOutcome, run_jobs
from bench.population.settings import (
    TASKS,
    Settings,
    client_command,
    member_seed,
    sampled,
    server_options,
)
from bench.provenance import commit


def parse() -> tuple[Settings, Path | None, bool]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--env", choices=sorted(TASKS), default="CartPole-v1")
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 members, 6,000 steps")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--sizes", default="4,8", help="population sizes, comma-separated")
    parser.add_argument("--steps", type=int, help="env steps per member (the task's default)")
    parser.add_argument("--ready-steps", type=int, help="the server's --pbt-ready-steps")
    parser.add_argument("--eval-interval", type=int, help="env steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--score-window", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes at once")
    parser.add_argument("--results", type=Path, help="JSON lines of finished jobs (resumable)")
    parser.add_argument("--keep", action="store_true", help="keep the runs' state dirs")
    parser.add_argument(
        "--hidden", help="every run's network widths (--hidden of DQN, --ppo-hidden of PPO)"
    )
    args = parser.parse_args()
    task = TASKS[args.env]
    changes = {
        "steps": args.steps,
        "ready_steps": args.ready_steps,
        "eval_interval": args.eval_interval,
    }
    if args.quick:
        changes = {"steps": 6_000, "ready_steps": 2_000, "eval_interval": 1_000}
    task = dataclasses.replace(task, **{k: v for k, v in changes.items() if v is not None})
    seeds = 1 if args.quick else args.seeds
    settings = Settings(
        task=task,
        seeds=tuple(range(args.first_seed, args.first_seed + seeds)),
        sizes=(2,) if args.quick else tuple(int(n) for n in args.sizes.split(",")),
        eval_episodes=3 if args.quick else args.eval_episodes,
        score_window=args.score_window,
        jobs=args.jobs,
        network=() if args.hidden is None else ("--hidden", args.hidden),
    )
    return settings, args.results, args.keep


def jobs_of(settings: Settings, root: Path) -> list[Job]:
    """Per seed: the population of each size, the independent runs, the defaults."""
    jobs = []
    for seed in settings.seeds:
        values = sampled(seed, settings.largest, settings.algo)

        def command(
            index: int,
            state: Path,
            extra: list[str],
            seed: int = seed,
            values: list[dict[str, float]] = values,
        ) -> list[str]:
            return client_command(
                f"m{index}",
                values[index],
                seed=member_seed(seed, index),
                settings=settings,
                state=state,
                extra=extra,
            )

        for n in sorted(settings.sizes, reverse=True):
            state = root / f"seed{seed}" / f"population{n}"
            jobs.append(
                Job(
                    seed,
                    f"population {n}",
                    state,
                    {f"m{i}": command(i, state, []) for i in range(n)},
                    server=server_options(settings),
                )
            )
        for index in range(settings.largest):
            state = root / f"seed{seed}" / "independent"
            jobs.append(
                Job(seed, "independent", state, {f"m{index}": command(index, state, ["--offline"])})
            )
        state = root / f"seed{seed}" / "default"
        default = client_command(
            "default", None, seed=member_seed(seed, 0), settings=settings, state=state,
            extra=["--offline"],
        )  # fmt: skip
        jobs.append(Job(seed, "default", state, {"default": default}))
    return jobs


def provenance(settings: Settings) -> dict[str, Any]:
    """What a finished job's figures depend on besides its seed and arm."""
    tree = commit()
    return {
        "commit": tree["commit"],
        "modified": tree["modified"],
        "task": dataclasses.asdict(settings.task),
        "algo": settings.algo,
        "eval_episodes": settings.eval_episodes,
        "score_window": settings.score_window,
        "network": list(settings.network),
    }


def finished_jobs(
    path: Path, expected: dict[str, Any]
) -> dict[tuple[int, str], list[MemberOutcome]]:
    """The jobs `path` holds, by (seed, arm); SystemExit where a line ran otherwise."""
    done: dict[tuple[int, str], list[MemberOutcome]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{path}:{number} is no JSON line of this bench: {exc}") from exc
        ran = record.get("provenance") or {}
        if not ran:
            differs = "no record of its commit and settings"
        elif expected["modified"] is not False or ran.get("modified") is not False:
            differs = "a tree with uncommitted changes, or one git could not name"
        else:
            differs = ", ".join(
                f"{key} {ran.get(key)!r} (now {value!r})"
                for key, value in expected.items()
                if ran.get(key) != value
            )
        if differs:
            raise SystemExit(
                f"{path}:{number} ran with {differs}: its figures are not this run's to "
                "resume; give --results another file"
            )
        members = [MemberOutcome(**m) for m in record["members"]]
        key = (record["seed"], record["arm"])
        done[key] = done.get(key, []) + members
    return done


def main() -> None:
    settings, results_path, keep = parse()
    task = settings.task
    print(
        f"{task.env} {settings.algo.upper()}: populations of {settings.sizes} against as many "
        f"independent runs and the defaults; {task.steps:,} env steps per member, evaluated "
        f"every {task.eval_interval:,} ({settings.eval_episodes} episodes), ready after "
        f"{task.ready_steps:,}, score over {settings.score_window} evaluations; "
        f"{' '.join(settings.network) or 'the default network'}; seeds "
        f"{list(settings.seeds)}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    ran = provenance(settings)
    done: dict[tuple[int, str], list[MemberOutcome]] = {}
    if results_path is not None and results_path.exists():
        done = finished_jobs(results_path, ran)
    with tempfile.TemporaryDirectory(prefix="bench-population-") as scratch:
        root = Path(scratch)
        if keep:
            root = Path(tempfile.mkdtemp(prefix="bench-population-"))
            print(f"state dirs in {root}")
        known = {(seed, arm, m.name) for (seed, arm), members in done.items() for m in members}
        jobs = [
            j
            for j in jobs_of(settings, root)
            if not all((j.seed, j.arm, name) in known for name in j.commands)
        ]
        start, total = time.monotonic(), len(jobs)

        def on_done(job: Job) -> None:
            outcomes = job.outcomes(task.target)
            done[(job.seed, job.arm)] = done.get((job.seed, job.arm), []) + outcomes
            if results_path is not None:
                record = {
                    "seed": job.seed,
                    "arm": job.arm,
                    "members": [vars(o) for o in outcomes],
                    "provenance": ran,
                }
                with results_path.open("a", encoding="utf-8") as file:
                    file.write(json.dumps(record) + "\n")
            finished = sum(1 for j in jobs if j.cpu and not j.processes)
            reached = [o.steps_to_target for o in outcomes if o.steps_to_target is not None]
            finals = ", ".join(
                f"{o.name} {o.final_eval:.0f}" for o in outcomes if o.final_eval is not None
            )
            print(
                f"[{time.monotonic() - start:7.0f} s] seed {job.seed} {job.arm}: {finals}"
                f" (last evaluations); first to {task.target:g}: "
                f"{min(reached) if reached else '-'}; CPU "
                f"{sum(o.cpu_s for o in outcomes):.0f} s; {finished}/{total} jobs",
                flush=True,
            )

        run_jobs(jobs, limit=settings.jobs, on_done=on_done)
    found = arms([(seed, arm, members) for (seed, arm), members in done.items()], settings)
    for line in per_seed_lines(found, settings):
        print(line)
    figures = summary(found, settings)
    for line in summary_lines(figures, settings):
        print(line)
    print(
        json.dumps(
            {
                "bench": "population",
                "settings": dataclasses.asdict(settings),
                "commit": ran["commit"],
                "modified": ran["modified"],
                "per_seed": [
                    {
                        "seed": e.seed,
                        "arm": e.arm,
                        "steps_to_target": e.steps_to_target,
                        "best_final_eval": e.best_final,
                        "cpu_s_per_member": e.cpu_per_member,
                    }
                    for e in found
                ],
                **figures,
                "load_at_end": os.getloadavg()[0],
            }
        )
    )
