"""kill -9 of a whole training run: nothing left in /dev/shm; the next run resumes the counters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

SHM = Path("/dev/shm")
CLI = [sys.executable, "-c", "from fedrl.client.commands.cli import main; main()"]
ARGS = [
    "--participant-id", "kim",
    "--offline",
    "--workers", "1",
    "--envs-per-worker", "4",
    "--steps-per-slot", "4",
    "--learning-starts", "100",
    "--hidden", "16",
    "--batch-size", "8",
    "--eval-interval", "0",
    "--save-model-every", "5",
    "--save-progress-every", "10",
]  # fmt: skip


def fedrl_segments() -> set[str]:
    return {p.name for p in SHM.glob("fedrl_*")}


def saved_episodes(state: Path) -> int:
    lines = (state / "metrics.jsonl").read_text().splitlines() if state.exists() else []
    return sum(1 for line in lines if line.endswith("}") and '"kind": "episode"' in line)


# Two CLI start-ups and an actor spawn: ~20 s on a quiet 2-core machine.
@pytest.mark.slow
def test_a_run_killed_with_sigkill_leaks_nothing_and_resumes(tmp_path: Path) -> None:
    # prepare: a run that would go on for long, until it has saved a model
    before = fedrl_segments()
    state = tmp_path / "kim"
    run = subprocess.Popen(
        [*CLI, *ARGS, "--episodes", "1000000", "--state-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not ((state / "progress.pt").exists() and saved_episodes(state) >= 15):
        assert run.poll() is None, run.stderr.read().decode() if run.stderr else ""
        assert time.monotonic() < deadline, "the run never saved"
        time.sleep(0.2)
    actors = psutil.Process(run.pid).children(recursive=True)

    # act: kill the learner's process outright; its actors must notice and go
    os.kill(run.pid, signal.SIGKILL)
    run.wait(timeout=30)
    _, alive = psutil.wait_procs(actors, timeout=30)
    leaked = fedrl_segments() - before
    deadline = time.monotonic() + 30
    while leaked and time.monotonic() < deadline:
        time.sleep(0.2)  # the resource tracker unlinks once the last process is gone
        leaked = fedrl_segments() - before
    logged = saved_episodes(state)

    assert alive == [], "actors outlived their learner"
    assert leaked == set()

    # act: the same participant again, to 20 episodes past what the killed run logged
    result = subprocess.run(
        [
            *CLI,
            *ARGS,
            "--workers",
            "0",
            "--episodes",
            str(logged + 20),
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    # assert: it resumed from the last model save (every 5 episodes; one
    # round of 4 envs x 4 steps ends at most 8 more) and counted on from there
    assert result.returncode == 0, result.stderr
    resumed_at = int(result.stderr.split("resuming kim at episode ")[1].split(",")[0])
    assert logged - 5 - 8 <= resumed_at <= logged
    stopped_at = int(result.stderr.split("stopped at episode ")[1].split(",")[0])
    assert stopped_at >= logged + 20
