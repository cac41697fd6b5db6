"""`fedrl-client --learners N`: ranks train as one participant, die loudly, and resume with any N.

Each test starts real rank processes on gloo (tiny networks, serial actors),
a few seconds of start-up each on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import main

CLI = [sys.executable, "-c", "from fedrl.client.commands.cli import main; main()"]
TINY = [
    "--participant-id", "kim",
    "--offline",
    "--workers", "0",
    "--envs-per-worker", "4",
    "--steps-per-slot", "4",
    "--learning-starts", "50",
    "--hidden", "16",
    "--batch-size", "8",
    "--eval-interval", "0",
    "--save-model-every", "2",
    "--save-progress-every", "4",
    "--log-interval", "60",
]  # fmt: skip


def episode_lines(state: Path) -> list[dict[str, object]]:
    records = [json.loads(line) for line in (state / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "episode"]


@pytest.mark.slow
def test_a_killed_rank_stops_every_rank_naming_it_and_the_state_resumes_with_one(
    tmp_path: Path,
) -> None:
    # prepare: two ranks with no end in sight, until rank 0 has saved a model
    run = subprocess.Popen(
        [*CLI, *TINY, "--learners", "2", "--episodes", "1000000", "--state-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stderr is not None
    lines: list[str] = []
    follower = None
    while follower is None:
        line = run.stderr.readline()
        assert line, "".join(lines)
        lines.append(line)
        found = re.match(r"learner rank 1 of 2: pid (\d+)", line)
        follower = int(found.group(1)) if found else None
    deadline = time.monotonic() + 60
    while not (tmp_path / "kim" / "model.pt").exists():
        assert run.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.1)

    # act: rank 1 dies without a word
    os.kill(follower, signal.SIGKILL)
    _, rest = run.communicate(timeout=120)
    output = "".join(lines) + rest

    # assert: the run fails, naming the rank and how it died; rank 0 saved where it stopped
    assert run.returncode == 1
    assert "learner rank 1 was killed by SIGKILL, so every rank stopped" in output
    saved = re.search(r"saved at episode (\d+)", output)
    assert saved, output
    assert int(saved.group(1)) == len(episode_lines(tmp_path / "kim"))

    # act: the same participant, one learner, ten more episodes
    result = CliRunner().invoke(
        main, [*TINY, "--episodes", "10", "--state-dir", str(tmp_path)], catch_exceptions=False
    )

    # assert: it resumed where the two ranks stopped and continued the numbering
    assert result.exit_code == 0, result.output
    assert f"resuming kim at episode {saved.group(1)}" in result.output
    episodes = [r["episode"] for r in episode_lines(tmp_path / "kim")]
    assert episodes == list(range(1, len(episodes) + 1))
    assert len(episodes) >= int(saved.group(1)) + 10


# Five rank processes start in turn: ~25 s on a 2-core machine. PPO's ranks are
# checked against one learner in the default suite (tests/test_distributed_learner.py).
@pytest.mark.slow
def test_two_ppo_learners_train_to_the_episode_budget_and_resume_as_three(tmp_path: Path) -> None:
    ppo = [
        "--participant-id", "ann",
        "--offline",
        "--algo", "ppo",
        "--workers", "0",
        "--envs-per-worker", "4",
        "--rollout-steps", "16",
        "--minibatch-size", "32",
        "--epochs", "2",
        "--eval-interval", "0",
        "--log-interval", "60",
        "--state-dir", str(tmp_path),
    ]  # fmt: skip

    # act
    first = CliRunner().invoke(
        main, [*ppo, "--learners", "2", "--episodes", "30"], catch_exceptions=False
    )
    done = len(episode_lines(tmp_path / "ann"))
    second = CliRunner().invoke(
        main, [*ppo, "--learners", "3", "--episodes", "10"], catch_exceptions=False
    )

    # assert: both ranks' episodes are the participant's; three ranks carry on from them
    assert first.exit_code == 0, first.output
    assert done >= 30
    assert second.exit_code == 0, second.output
    assert len(episode_lines(tmp_path / "ann")) >= done + 10
