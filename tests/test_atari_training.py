"""A game end to end: trained alone through actor processes, and by two participants together."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import main
from fedrl.client.commands.video import count_frames
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.server_harness import ServerProcess
from tests.test_sync_e2e import Participant

GAME = "ALE/Breakout-v5"
TINY_GAME = [
    "--env", GAME,
    "--envs-per-worker", "4",
    "--learning-starts", "300",
    "--replay-capacity", "6000",
    "--eval-episodes", "2",
    "--eval-max-steps", "300",
]  # fmt: skip


@pytest.fixture
def started() -> Iterator[list[Participant | ServerProcess]]:
    """Every process a test starts; killed at the end whatever happened."""
    processes: list[Participant | ServerProcess] = []
    yield processes
    for process in processes:
        process.kill()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_game_trains_in_actor_processes_evaluates_and_plays_into_a_video(
    tmp_path: Path,
) -> None:
    train = CliRunner().invoke(
        main,
        [
            "--offline",
            "--participant-id", "Макар",
            "--state-dir", str(tmp_path),
            "--workers", "1",
            "--max-env-steps", "3000",
            "--eval-interval", "1500",
            *TINY_GAME,
        ],
    )  # fmt: skip
    out = tmp_path / "play.mp4"
    play = CliRunner().invoke(
        main,
        [
            "record",
            "--model",
            str(tmp_path / "Макар" / "best.pt"),
            "--out",
            str(out),
            "--max-steps",
            "200",
        ],
    )

    assert train.exit_code == 0, train.output
    records = [
        json.loads(line) for line in (tmp_path / "Макар" / "metrics.jsonl").read_text().splitlines()
    ]
    evals = [r for r in records if r["kind"] == "eval"]
    games = [r for r in records if r["kind"] == "episode"]
    assert len(evals) == 2 and all(r["mean"] >= 0 for r in evals)
    # Whole games: a game of Breakout with five lives lasts over 100 agent steps.
    assert games and all(r["length"] > 100 for r in games)
    assert any(r["kind"] == "train" and r["updates"] > 0 for r in records)
    assert play.exit_code == 0, play.output
    assert count_frames(out) == int(play.output.split(": ", 1)[1].split(" frames")[0]) > 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_participants_train_a_game_together_over_loopback(
    tmp_path: Path, started: list[Participant | ServerProcess]
) -> None:
    server = ServerProcess(tmp_path / "server", "--buffer-size", "2", "--buffer-timeout-s", "1")
    started.append(server.start())
    options = [
        "--workers", "0",
        "--eval-interval", "0",
        "--max-env-steps", "2500",
        "--sync-interval", "2",
        "--push-transitions", "256",
        "--pull-transitions", "1024",
        *TINY_GAME,
    ]  # fmt: skip
    pair = [
        Participant(server.address, tmp_path / "s", pid, *options) for pid in ("Макар", "alice")
    ]
    started.extend(pair)

    codes = [p.wait(540) for p in pair]

    assert codes == [0, 0], [p.output for p in pair]
    reply = server.stub().Status(pb.StatusRequest(max_versions=10_000))
    session = reply.sessions[0]
    by_id = {p.participant_id: p for p in session.participants}
    assert by_id.keys() == {"Макар", "alice"}
    assert all(p.episodes > 0 and p.updates_accepted > 0 for p in by_id.values())
    assert all(p.experience_batches > 0 and p.experience_rejected == 0 for p in by_id.values())
    assert session.current_version > 0
    out = tmp_path / "global.mp4"
    play = CliRunner().invoke(
        main,
        [
            "record", "--server", server.address, "--participant-id", "Макар",
            "--env", GAME, "--max-steps", "50", "--out", str(out),
        ],
    )  # fmt: skip
    assert play.exit_code == 0, play.output
    assert f"global version {session.current_version}" in play.output
    assert count_frames(out) == 51
