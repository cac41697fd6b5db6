"""`fedrl-client record`: a model plays greedily into a video that decodes with every frame."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fedrl.client.commands.cli import main
from fedrl.client.commands.state_dir import ModelIdentity, StateDir
from fedrl.client.commands.video import VideoWriter, count_frames, scale, with_caption
from fedrl.client.training.counters import Counters
from fedrl.client.training.q_network import build_q_network, named_arrays


def saved_model(tmp_path: Path, env: str, obs_shape: tuple[int, ...], n_actions: int) -> Path:
    """A state dir's model.pt of an untrained Q-network for `env`."""
    state = StateDir(tmp_path / "state", "Макар", ModelIdentity(env=env, architecture="dqn/test"))
    state.save_model(named_arrays(build_q_network(obs_shape, n_actions, hidden=(16,))), Counters())
    return state.path / "model.pt"


@pytest.mark.parametrize(
    ("env", "obs_shape", "n_actions", "max_steps"),
    [("CartPole-v1", (4,), 2, 500), ("ALE/Breakout-v5", (4, 84, 84), 4, 40)],
)
def test_record_writes_a_video_that_decodes_with_one_frame_per_step_plus_the_first(
    tmp_path: Path, env: str, obs_shape: tuple[int, ...], n_actions: int, max_steps: int
) -> None:
    model = saved_model(tmp_path, env, obs_shape, n_actions)
    out = tmp_path / "play.mp4"

    result = CliRunner().invoke(
        main,
        ["record", "--model", str(model), "--out", str(out), "--max-steps", str(max_steps)],
    )

    assert result.exit_code == 0, result.output
    frames = int(result.output.split(": ", 1)[1].split(" frames")[0])
    assert count_frames(out) == frames
    # One frame at the start and one per step: an untrained CartPole policy falls within
    # its 500 steps, Breakout's is cut at --max-steps.
    assert 2 <= frames <= max_steps + 1
    assert env != "ALE/Breakout-v5" or frames == max_steps + 1


@pytest.mark.parametrize("opponent", ["lookahead", "self"])
def test_a_two_player_game_records_one_frame_per_move_pair(tmp_path: Path, opponent: str) -> None:
    pytest.importorskip("pettingzoo")
    env = "pettingzoo/tictactoe_v3"
    state = StateDir(tmp_path / "state", "Макар", ModelIdentity(env=env, architecture="dqn/t"))
    net = build_q_network((27,), 9, hidden=(16,), action_mask=True)
    state.save_model(named_arrays(net), Counters())
    out = tmp_path / "game.gif"

    result = CliRunner().invoke(
        main,
        [
            "record",
            "--model",
            str(state.path / "model.pt"),
            "--out",
            str(out),
            "--episodes",
            "2",
            "--opponent",
            opponent,
        ],
    )

    assert result.exit_code == 0, result.output
    scores = result.output.split("scores ", 1)[1].split(", ")
    assert all(float(score) in (-1.0, 0.0, 1.0) for score in scores)
    # A game of tic-tac-toe is at most five of the model's moves: six frames an episode.
    assert 2 * 2 <= count_frames(out) <= 2 * 6


def test_two_episodes_into_a_gif_on_request(tmp_path: Path) -> None:
    model = saved_model(tmp_path, "CartPole-v1", (4,), 2)
    out = tmp_path / "play.gif"

    result = CliRunner().invoke(
        main, ["record", "--model", str(model), "--out", str(out), "--episodes", "2"]
    )

    assert result.exit_code == 0, result.output
    assert out.exists() and count_frames(out) > 2
    assert result.output.count("scores") == 1 and ", " in result.output.split("scores", 1)[1]


def test_an_existing_video_is_kept_unless_overwrite(tmp_path: Path) -> None:
    model = saved_model(tmp_path, "CartPole-v1", (4,), 2)
    out = tmp_path / "play.mp4"
    out.write_bytes(b"mine")

    refused = CliRunner().invoke(main, ["record", "--model", str(model), "--out", str(out)])

    assert refused.exit_code != 0 and "--overwrite" in refused.output
    assert out.read_bytes() == b"mine"


def test_a_model_file_or_a_server_is_required_and_its_env_must_fit(tmp_path: Path) -> None:
    model = saved_model(tmp_path, "CartPole-v1", (4,), 2)

    neither = CliRunner().invoke(main, ["record", "--out", str(tmp_path / "a.mp4")])
    wrong_env = CliRunner().invoke(
        main,
        ["record", "--model", str(model), "--env", "Acrobot-v1", "--out", str(tmp_path / "b.mp4")],
    )

    assert neither.exit_code != 0 and "--model or --server" in neither.output
    assert wrong_env.exit_code != 0 and "Acrobot-v1" in wrong_env.output


def test_captions_sit_above_frames_scaled_up_by_a_whole_factor(tmp_path: Path) -> None:
    frame = np.full((210, 160, 3), 90, dtype=np.uint8)

    shown = with_caption(scale(frame, 400), "score 12")
    with VideoWriter(tmp_path / "one.mp4", fps=10) as video:
        video.add(shown)

    assert shown.shape[1:] == (320, 3) and shown.shape[0] > 420
    assert (shown[-420:] == 90).all() and shown[:20].max() == 255
    assert count_frames(video.written) == 1
