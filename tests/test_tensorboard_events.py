"""TensorBoard event files on participants and the server, read back with TensorBoard's reader."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedrl.client.commands.cli import main
from fedrl.client.commands.training_events import TrainingEvents, scalars_of, tensorboard_dir
from fedrl.common.event_files import ScalarEvents
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.server_harness import InProcessServer, join, make_spec, push, seed, server_config

TINY = [
    "--workers", "0",
    "--envs-per-worker", "4",
    "--steps-per-slot", "4",
    "--learning-starts", "100",
    "--hidden", "16",
    "--batch-size", "8",
    "--eval-interval", "300",
    "--eval-episodes", "2",
]  # fmt: skip

Points = list[tuple[int, float]]


def read_scalars(logdir: Path) -> dict[str, Points]:
    """Every scalar in a run directory as (step, value) in file order, by TensorBoard's reader."""
    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def expected_scalars(metrics: Path) -> dict[str, Points]:
    """What TensorBoard should hold for a metrics.jsonl: each numeric field at its env steps."""
    expected: dict[str, Points] = defaultdict(list)
    for line in metrics.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for tag, value in scalars_of(record).items():
            # Event files store float32, as TensorBoard does.
            expected[tag].append((record["env_steps"], float(np.float32(value))))
    return dict(expected)


def test_an_offline_run_writes_every_metrics_field_as_a_scalar_at_its_env_steps(
    tmp_path: Path,
) -> None:
    # act
    result = CliRunner().invoke(
        main,
        ["--participant-id", "Макар", "--offline", "--episodes", "30",
         "--state-dir", str(tmp_path), *TINY],
    )  # fmt: skip

    # assert
    assert result.exit_code == 0, result.output
    state = tmp_path / "Макар"
    scalars = read_scalars(state)
    for derived in ("speed/env_steps_per_s", "speed/updates_per_s", "explore/epsilon"):
        scalars.pop(derived, None)  # measured over time: the test below checks them
    assert scalars == expected_scalars(state / "metrics.jsonl")
    assert {"episode/return", "episode/length", "train/loss", "eval/mean", "eval/best"} <= set(
        scalars
    )
    assert len(scalars["episode/return"]) >= 30


def test_a_federated_run_also_writes_its_sync_and_adoption_events(tmp_path: Path) -> None:
    # prepare
    config = server_config(tmp_path / "server", buffer_size=1)

    # act
    with InProcessServer(config) as server:
        result = CliRunner().invoke(
            main,
            ["--participant-id", "李雷", "--server", server.address, "--episodes", "16",
             "--sync-interval", "2", "--share", "weights", "--state-dir", str(tmp_path / "st"),
             "--tensorboard", str(tmp_path / "tb"), *TINY],
        )  # fmt: skip

    # assert
    assert result.exit_code == 0, result.output
    scalars = read_scalars(tmp_path / "tb" / "李雷")
    expected = expected_scalars(tmp_path / "st" / "李雷" / "metrics.jsonl")
    assert {tag: scalars[tag] for tag in expected} == expected
    assert {"sync/version", "sync/session_episodes", "adopt/version"} <= set(scalars)
    assert not list((tmp_path / "st" / "李雷").glob("events.out.tfevents.*"))


def test_tensorboard_off_writes_no_event_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["--participant-id", "ann", "--offline", "--episodes", "3", "--state-dir", str(tmp_path),
         "--tensorboard", "off", *TINY],
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert (tmp_path / "ann" / "metrics.jsonl").exists()
    assert not list(tmp_path.rglob("events.out.tfevents.*"))


def test_event_files_go_to_the_state_dir_unless_a_directory_or_off_is_given() -> None:
    root = Path("fedrl-state")

    assert tensorboard_dir("", root, "Макар") == root / "Макар"
    assert tensorboard_dir("runs", root, "Макар") == Path("runs") / "Макар"
    assert tensorboard_dir("off", root, "Макар") is None


def train_record(time_s: float, env_steps: int, updates: int) -> dict[str, Any]:
    return {"kind": "train", "time": time_s, "episode": 1, "env_steps": env_steps,
            "updates": updates, "episodes": 1, "replay_size": 10}  # fmt: skip


def test_speeds_are_measured_over_at_least_five_seconds_and_come_with_epsilon(
    tmp_path: Path,
) -> None:
    # prepare
    events = TrainingEvents(tmp_path, epsilon=0.25)

    # act
    events.write([train_record(100.0, 0, 0), train_record(102.0, 2_000, 500)])
    events.write([train_record(110.0, 10_000, 2_500), train_record(113.0, 13_000, 3_000)])
    events.close()

    # assert
    scalars = read_scalars(tmp_path)
    assert scalars["speed/env_steps_per_s"] == [(10_000, 1_000.0)]
    assert scalars["speed/updates_per_s"] == [(10_000, 250.0)]
    assert scalars["explore/epsilon"] == [(10_000, 0.25)]
    assert [step for step, _ in scalars["train/replay_size"]] == [0, 2_000, 10_000, 13_000]


def test_values_that_are_not_finite_numbers_are_left_out_and_no_empty_file_is_made(
    tmp_path: Path,
) -> None:
    events = ScalarEvents(tmp_path / "run")

    events.add({"a": float("nan"), "b": float("inf")}, step=1, wall_time=time.time())
    assert not (tmp_path / "run").exists()
    events.add({"a": 1.5, "b": float("nan"), "flag": True}, step=2, wall_time=time.time())
    events.close()

    assert read_scalars(tmp_path / "run") == {"a": [(2, 1.5)]}


@pytest.mark.parametrize("session", ["default", "Сессия"])
def test_the_server_writes_each_version_as_scalars_of_its_session(
    tmp_path: Path, session: str
) -> None:
    # prepare
    spec = make_spec([(4,)])
    config = server_config(tmp_path / "data", buffer_size=1, tensorboard=True)
    metrics = pb.UpdateMetrics(mean_return=20.0)

    # act
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "Макар", spec, session=session)
        seed(stub, "Макар", spec, [np.zeros(4, np.float32)], session=session)
        for sequence in (1, 2):
            push(
                stub, "Макар", spec, [np.ones(4, np.float32)], sequence=sequence,
                base_version=0, session=session, metrics=metrics,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while stub.Status(pb.StatusRequest(session=session)).sessions[0].current_version < 2:
            assert time.monotonic() < deadline, "no version 2 within a minute"
            time.sleep(0.05)

    # assert
    scalars = read_scalars(tmp_path / "data" / "tensorboard" / session)
    assert scalars["version/contributors"] == [(0, 1.0), (1, 1.0), (2, 1.0)]
    assert scalars["version/updates"] == [(0, 0.0), (1, 1.0), (2, 1.0)]
    assert scalars["version/mean_return"] == [(1, 20.0), (2, 20.0)]
    assert [step for step, _ in scalars["version/max_staleness"]] == [0, 1, 2]
