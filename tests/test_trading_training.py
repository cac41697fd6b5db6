"""A short DQN training run on the synthetic market, through the normal client command.

It runs the installed `fedrl-client` in a fresh interpreter: in this test process an earlier
test has usually imported fedrl.envs already, which would hide a client that forgot to
register fedrl/Trading-v0 itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = Path(sys.executable).with_name("fedrl-client")


def train(state_dir: Path, *, episodes: int, workers: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(CLIENT),
            "--offline",
            "--env",
            "fedrl/Trading-v0",
            "--episodes",
            str(episodes),
            "--workers",
            str(workers),
            "--participant-id",
            "t",
            "--state-dir",
            str(state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_offline_training_on_the_synthetic_market_completes(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"

    run = train(state_dir, episodes=3, workers=0)

    assert run.returncode == 0, run.stdout + run.stderr
    assert "SYNTHETIC" in run.stderr  # the log says the market is not real
    assert list(state_dir.rglob("model.pt")), "training saved no model"


@pytest.mark.slow
def test_spawned_actor_processes_find_the_trading_env(tmp_path: Path) -> None:
    # Actors are spawned: each child must register fedrl/Trading-v0 on its own.
    state_dir = tmp_path / "state"

    run = train(state_dir, episodes=20, workers=2)

    assert run.returncode == 0, run.stdout + run.stderr
    assert list(state_dir.rglob("model.pt")), "training saved no model"
