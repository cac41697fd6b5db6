"""Updates/s and env steps/s of one participant with 1 and 2 data-parallel learner ranks.

Runs the product: `fedrl-client --offline --learners N` (ranks on gloo for
the CPU, NCCL for GPUs) on CartPole-v1 with the default DQN, every rank in
serial mode (its own actor in its own process), for a fixed number of env
steps, and reads the rates off rank 0's metrics.jsonl between the first
training record and the last, so start-up and the replay's warm-up are not
counted. Each update of N ranks learns from N batches, so samples/s
(updates × N × batch) is the figure to compare; updates per env step stay at
the replay ratio over N by design (fedrl.client.training.replay_schedule).

On a CPU-only machine with C cores the honest ceiling is C ranks' worth of
cores shared by learners and envs: on 2 cores, 2 ranks cannot beat 1 by much.
Where CUDA GPUs are present the same command also runs the ranks on them
(one GPU each, NCCL) and prints those rows; where not, it says so.

    .venv/bin/python bench/distributed.py [--quick] [--repeats 3]

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CLI = [sys.executable, "-c", "from fedrl.client.commands.cli import main; main()"]
BATCH = 64


def run(learners: int, device: str, env_steps: int, root: Path) -> dict[str, float]:
    """One run; its steady rates from rank 0's train records."""
    state = root / f"{device}-{learners}-{time.monotonic_ns()}"
    command = [
        *CLI,
        "--participant-id", "bench",
        "--offline",
        "--state-dir", str(state),
        "--learners", str(learners),
        "--workers", "0",
        "--device", device,
        "--batch-size", str(BATCH),
        "--eval-interval", "0",
        "--episodes", "100000000",
        "--max-env-steps", str(env_steps),
        "--log-interval", "3600",
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - started
    records = [json.loads(line) for line in (state / "bench" / "metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train" and r["updates"] > 0]
    first, last = train[0], train[-1]
    seconds = last["time"] - first["time"]
    updates = (last["updates"] - first["updates"]) / seconds
    return {
        "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / seconds,
        "updates_per_s": updates,
        "samples_per_s": updates * learners * BATCH,
        "wall_s": wall,
    }


def median_of(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short run per row")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row; medians shown")
    parser.add_argument("--env-steps", type=int, default=40_000, help="env steps per run")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    env_steps = 8_000 if args.quick else args.env_steps
    rows: list[tuple[str, int]] = [("cpu", 1), ("cpu", 2)]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    rows += [("cuda", n) for n in (1, 2) if n <= gpus]
    load = os.getloadavg()[0]
    print(
        f"CartPole-v1 DQN, batch {BATCH} per rank, every rank serial, {env_steps} env steps, "
        f"median of {repeats}; {os.cpu_count()} cores, load {load:.1f} at start"
    )
    if not gpus:
        print("GPU: none here (torch sees no CUDA device), so no NCCL rows")
    print(f"{'device':>6} {'ranks':>5} {'env steps/s':>12} {'updates/s':>10} {'samples/s':>10}")
    results = []
    baseline: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as root:
        for device, learners in rows:
            figures = median_of(
                [run(learners, device, env_steps, Path(root)) for _ in range(repeats)]
            )
            base = baseline.setdefault(device, figures)
            ratio = figures["samples_per_s"] / base["samples_per_s"]
            print(
                f"{device:>6} {learners:>5} {figures['env_steps_per_s']:>12,.0f} "
                f"{figures['updates_per_s']:>10,.0f} {figures['samples_per_s']:>10,.0f}"
                f"   samples/s vs 1 rank {ratio:.2f}x"
            )
            results.append({"device": device, "learners": learners, **figures})
    print(
        json.dumps(
            {
                "bench": "distributed",
                "env_steps": env_steps,
                "repeats": repeats,
                "cores": os.cpu_count(),
                "load_at_start": load,
                "gpus": gpus,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
