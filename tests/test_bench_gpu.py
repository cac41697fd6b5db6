"""bench/gpu.py (`make bench-gpu`) and bench/learner.py on a machine without a GPU.

The GPU figures themselves need an H100; what the CPU can check is that the
same command runs every part and writes one JSON file of the promised shape,
and that the rates come out of an offline run's metrics as they should.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu as gpu_bench

ROOT = Path(__file__).resolve().parents[1]


def test_offline_rates_count_from_the_first_to_the_last_trained_record() -> None:
    records = [
        {"kind": "episode", "time": 0.0, "env_steps": 100},
        {"kind": "train", "time": 1.0, "env_steps": 1_000, "updates": 0},
        {"kind": "train", "time": 2.0, "env_steps": 2_000, "updates": 10},
        {"kind": "eval", "time": 3.0, "env_steps": 3_000, "updates": 200},
        {"kind": "train", "time": 6.0, "env_steps": 6_000, "updates": 1_010},
    ]

    figures = gpu_bench.rates(records, replay_ratio=0.25)

    assert figures["env_steps_per_s"] == 1_000.0
    assert figures["updates_per_s"] == 250.0
    assert figures["replay_ratio_kept"] == 0.25
    assert figures["env_steps"] == 6_000


def test_a_run_too_short_to_rate_says_so() -> None:
    figures = gpu_bench.rates(
        [{"kind": "train", "time": 1.0, "env_steps": 9, "updates": 3}], replay_ratio=0.25
    )

    assert "too short" in figures["error"]


def test_a_part_that_fails_is_reported_with_its_output_not_raised() -> None:
    failed = gpu_bench.run_part([sys.executable, "-c", "import sys; sys.exit('no GPU')"], 30)
    silent = gpu_bench.run_part([sys.executable, "-c", "print('not json')"], 30)

    assert failed["error"] == "exit status 1" and "no GPU" in failed["stderr_tail"]
    assert silent["error"].startswith("no JSON on the last line")


@pytest.mark.slow
def test_the_gpu_check_runs_every_part_on_the_cpu_and_writes_one_json_file(
    tmp_path: Path,
) -> None:
    # prepare / act: the same command `make bench-gpu` runs, CPU-sized
    out = tmp_path / "bench-gpu.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu.py"),
            "--device",
            "cpu",
            "--env",
            "CartPole-v1",
            "--seconds",
            "40",
            "--quick",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    # assert: one file, every part's figures, the same object on stdout's last line. How far
    # the offline run gets before its Ctrl-C depends on this machine's load: it has rates,
    # or says why not, and the exit status says whether any part failed.
    report = json.loads(out.read_text(encoding="utf-8"))
    assert json.loads(done.stdout.strip().splitlines()[-1]) == report
    assert done.returncode == (1 if report["failed"] else 0)
    assert set(report["failed"]) <= {"offline"}, done.stdout[-3000:]
    assert {row["variant"] for row in report["learner"]["results"]} == {"sb3-eager", "fedrl"}
    assert all(row["updates_per_s"] > 0 for row in report["learner"]["results"])
    assert report["check"]["recommendation"]["env"] == "CartPole-v1"
    offline = report["offline"]
    assert {"ran_s", "exit_status", "log_tail"} <= set(offline)
    if "error" not in offline:
        assert offline["env_steps_per_s"] > 0 and offline["updates_per_s"] > 0
        assert offline["replay_ratio_asked"] == 0.25


@pytest.mark.slow
def test_the_learner_bench_times_this_tree_against_a_git_revision(tmp_path: Path) -> None:
    # prepare / act: a tiny run with HEAD as the reference revision
    out = tmp_path / "learner.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "learner.py"),
            "--device",
            "cpu",
            "--threads",
            "1",
            "--batch-sizes",
            "16",
            "--updates",
            "5",
            "--rounds",
            "1",
            "--replay-rows",
            "256",
            "--reference",
            "HEAD",
            "--json-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    # assert: the bench's own variants, and the fedrl variant of both trees, in one object
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    variants = {row["variant"] for row in report["results"]}
    assert variants == {"sb3-eager", "fedrl", "fedrl-this-tree", "fedrl-HEAD"}
    assert "this tree/HEAD" in done.stdout
