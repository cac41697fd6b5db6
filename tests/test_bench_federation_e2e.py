"""`python -m bench.federation` end to end: a pair through a real server beside its three
references, at a budget far too short to learn, ending with the JSON line of every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_tiny_invocation_ends_with_every_groups_speedups_intervals_and_iqm_steps(
    tmp_path: Path,
) -> None:
    # prepare: one seed, a pair sharing both, 600 steps each (the lone references 900),
    # updates from the 100th transition so that every learner makes some.
    argv = [
        *("--n", "2", "--no-lone", "--modes", "both", "--seeds", "0"),
        *("--budget", "600", "--offline-budget", "900", "--eval-every", "300"),
        *("--eval-episodes", "2", "--learner", "learning_starts=100"),
        # A rule other than the session's default: the session must take it from the run.
        *("--foreign-credit", "3"),
        *("--plot", str(tmp_path / "federation.png")),
    ]

    # act
    done = subprocess.run(
        [sys.executable, "-m", "bench.federation", *argv],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )

    # assert
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    (pair,) = figures["configurations"]
    assert pair["key"] == "dqn both N=2"
    for key in ("speedup_vs_compute_matched", "speedup_vs_default_lone", "speedup_vs_pooled"):
        assert pair[key] > 0
        low, high = pair["ci95"][key]
        assert low <= pair[key] <= high
    # Unsolved within 600 steps, the pair counts at the lone references' longer budget.
    assert pair["per_seed_steps"] == [None]
    assert pair["iqm_steps"] == 900
    assert pair["gain"]["speedup_vs_default_lone"] == "no measurable gain"
    references = pair["references"]
    assert references["default_lone"]["iqm_steps"] == 900
    assert references["compute_matched_lone"]["matched"]
    assert references["compute_matched_lone"]["replay_ratio"] > 0
    assert references["pooled"]["matched"] and references["pooled"]["n"] == 2
    for arrangement in (pair, *references.values()):
        assert arrangement["cpu_seconds_per_1000_steps"] > 0
        assert arrangement["iqm_cpu_seconds_to_target_per_participant"] > 0
        assert arrangement["iqm_wall_seconds_to_target_per_participant"] > 0
    assert figures["seeds"] == [0]
    assert figures["machine"]["cores_available"] >= 1
    assert "commit" in figures
    # The lone learners run and are scored to their own budget; the pooled learner takes
    # both participants' steps, scored at the pair's marks.
    lone_runs = [r for r in figures["runs"] if r["mode"] == "offline"]
    assert lone_runs and all(r["marks"] == [300, 600, 900] for r in lone_runs)
    assert all(r["participants"][0]["env_steps"] >= 900 for r in lone_runs)
    pooled_runs = [r for r in figures["runs"] if r["mode"] == "pooled"]
    assert pooled_runs and all(r["marks"] == [300, 600] for r in pooled_runs)
    assert all(r["participants"][0]["env_steps"] >= 1_200 for r in pooled_runs)
    assert "speed-up vs compute-matched lone:" in done.stdout
    assert (tmp_path / "federation.png").stat().st_size > 0
