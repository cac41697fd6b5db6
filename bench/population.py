"""A population of 4 (population-based training) against 4 independent runs, same hyperparameters.

Task: CartPole-v1 with the default DQN. For each seed, 4 sets of the four
searched hyperparameters (lr, γ, Ape-X ε base, target interval) are drawn
uniformly from their ranges (fedrl.common.hyperparameters: log-uniform lr
and interval, γ through its horizon), and both arms start from exactly those:

- independent: 4 × `fedrl-client --offline`, each with its own set, fixed;
- population: 4 × `fedrl-client --mode pbt` in one session of a local
  `fedrl-server` (--pbt-ready-steps below), which ranks them and has the
  bottom quarter copy the top quarter and explore.

Every member has the same env-step budget in both arms, so both spend the
same total env steps; each is evaluated greedily (10 episodes) every 2,000 of
its env steps. Reported per arm and seed: the best member's final
evaluation, and the fewest env steps any member needed to reach 475 (its
steps; a copier's count includes the steps it trained before copying).
The four runs of an arm run at once, in serial mode (one process each).

    .venv/bin/python bench/population.py [--quick] [--seeds 3] [--steps 40000]

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fedrl.common.hyperparameters import SEARCH_SPACE, SEARCHED
from fedrl.server.launcher import ServerProcess

CLI = [sys.executable, "-c", "from fedrl.client.commands.cli import main; main()"]
MEMBERS = 4
TARGET = 475.0
EVAL_INTERVAL = 2_000
FLAGS = {
    "lr": "--lr",
    "gamma": "--gamma",
    "exploration_base": "--exploration-base",
    "target_update_interval": "--target-update-interval",
}


def sampled(seed: int) -> list[dict[str, float]]:
    """MEMBERS sets of DQN hyperparameters, drawn from the search space."""
    rng = random.Random(seed)
    return [
        {name: SEARCH_SPACE[name].resample(rng) for name in SEARCHED["dqn"]} for _ in range(MEMBERS)
    ]


def member_command(
    name: str,
    values: dict[str, float],
    *,
    seed: int,
    steps: int,
    state: Path,
    extra: list[str],
) -> list[str]:
    command = [
        *CLI,
        "--participant-id", name,
        "--state-dir", str(state),
        "--workers", "0",
        "--seed", str(seed),
        "--episodes", "100000000",
        "--max-env-steps", str(steps),
        "--eval-interval", str(EVAL_INTERVAL),
        "--eval-episodes", "10",
        "--log-interval", "3600",
        *extra,
    ]  # fmt: skip
    for key, value in values.items():
        text = str(int(value)) if key == "target_update_interval" else repr(value)
        command += [FLAGS[key], text]
    return command


def run_arm(commands: list[list[str]]) -> None:
    """The members of one arm at once; raises if any fails."""
    with tempfile.TemporaryFile() as log:
        processes = [subprocess.Popen(c, stdout=log, stderr=log) for c in commands]
        codes = [p.wait() for p in processes]
        if any(codes):
            log.seek(0)
            raise RuntimeError(f"a member failed ({codes}):\n{log.read().decode()[-3000:]}")


def outcome(state: Path, names: list[str]) -> dict[str, float | None]:
    """Best member's final evaluation; fewest env steps any member took to the target."""
    finals, reached = [], []
    for name in names:
        lines = (state / name / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        evals = [r for r in map(json.loads, lines) if r["kind"] == "eval"]
        if evals:
            finals.append(evals[-1]["mean"])
        hits = [r["env_steps"] for r in evals if r["mean"] >= TARGET]
        if hits:
            reached.append(hits[0])
    return {
        "best_final_eval": max(finals) if finals else None,
        "steps_to_target": min(reached) if reached else None,
    }


def one_seed(seed: int, steps: int, ready: int, root: Path) -> dict[str, dict[str, float | None]]:
    values = sampled(seed)
    names = [f"m{i}" for i in range(MEMBERS)]
    independent = root / f"independent-{seed}"
    run_arm(
        [
            member_command(
                n, v, seed=seed * 10 + i, steps=steps, state=independent, extra=["--offline"]
            )
            for i, (n, v) in enumerate(zip(names, values, strict=True))
        ]
    )
    population = root / f"population-{seed}"
    with ServerProcess(root / f"server-{seed}", "--pbt-ready-steps", str(ready)) as server:
        extra = ["--mode", "pbt", "--server", server.address, "--session", f"pbt{seed}"]
        run_arm(
            [
                member_command(n, v, seed=seed * 10 + i, steps=steps, state=population, extra=extra)
                for i, (n, v) in enumerate(zip(names, values, strict=True))
            ]
        )
    return {"independent": outcome(independent, names), "population": outcome(population, names)}


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 8,000 steps per member")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40_000, help="env steps per member")
    parser.add_argument(
        "--ready-steps", type=int, default=8_000, help="the server's --pbt-ready-steps"
    )
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    steps = 8_000 if args.quick else args.steps
    ready = 4_000 if args.quick else args.ready_steps
    load = os.getloadavg()[0]
    print(
        f"CartPole-v1 DQN, {MEMBERS} members x {steps:,} env steps per arm, ready every "
        f"{ready:,} steps, {seeds} seed(s); {os.cpu_count()} cores, load {load:.1f} at start"
    )
    print(f"{'seed':>4} {'arm':>12} {'best final eval':>16} {'steps to 475':>13}")
    results = []
    with tempfile.TemporaryDirectory() as root:
        for seed in range(seeds):
            arms = one_seed(seed, steps, ready, Path(root))
            for arm, figures in arms.items():
                print(
                    f"{seed:>4} {arm:>12} {fmt(figures['best_final_eval'], 1):>16} "
                    f"{fmt(figures['steps_to_target']):>13}"
                )
                results.append({"seed": seed, "arm": arm, **figures})
    for arm in ("independent", "population"):
        finals = [r["best_final_eval"] for r in results if r["arm"] == arm]
        hits = [r["steps_to_target"] for r in results if r["arm"] == arm]
        reached = [h for h in hits if h is not None]
        print(
            f"{arm}: median best final eval {fmt(statistics.median(f or 0 for f in finals), 1)}, "
            f"reached {TARGET:.0f} in {len(reached)} of {len(hits)} seeds"
            + (f" (median {statistics.median(reached):,.0f} steps)" if reached else "")
        )
    print(
        json.dumps(
            {
                "bench": "population",
                "members": MEMBERS,
                "steps_per_member": steps,
                "ready_steps": ready,
                "seeds": seeds,
                "load_at_start": load,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
