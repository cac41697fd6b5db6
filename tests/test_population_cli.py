"""`fedrl-client --mode pbt`: a member ranked at the bottom copies a better one; status shows it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from fedrl.client.commands.cli import main
from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from tests.support.population import (
    DQN_VALUES,
    enroll,
    join_population,
    population_stub,
    report,
)
from tests.support.server_harness import InProcessServer

MEMBER = [
    "--mode", "pbt",
    "--session", "pop",
    "--workers", "0",
    "--envs-per-worker", "4",
    "--steps-per-slot", "4",
    "--learning-starts", "100",
    "--hidden", "16",
    "--batch-size", "8",
    "--eval-interval", "200",
    "--eval-episodes", "2",
    "--log-interval", "60",
]  # fmt: skip
CONFIG = TrainConfig(
    engine=EngineConfig(workers=0, envs_per_worker=4, steps_per_slot=4),
    learner=LearnerConfig(hidden=(16,), batch_size=8, learning_starts=100),
)


def records(state: Path, kind: str) -> list[dict[str, object]]:
    lines = (state / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_a_member_ranked_at_the_bottom_copies_a_better_member_and_resumes_its_place(
    start_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    # prepare: two members with high scores, reported through the protocol
    server = start_server(pbt_ready_steps=200, pbt_resample_probability=0.0)
    engine = TrainingEngine(CONFIG.engine, CONFIG.learner_config, network=CONFIG.network)
    weights = engine.weights()
    engine.close()
    spec = model_spec("CartPole-v1", weights, CONFIG.architecture())
    federation, population = server.stub(), population_stub(server.address)
    for rank, (name, score) in enumerate((("ann", 500.0), ("bo", 480.0))):
        join_population(federation, name, spec, session="pop")
        enroll(population, name, {**DQN_VALUES, "lr": 2e-3 + rank * 1e-3}, session="pop")
        report(
            population,
            name,
            spec,
            [w + rank for _, w in weights],
            sequence=1,
            env_steps=100,
            score=score,
            session="pop",
        )
    common = [*MEMBER, "--server", server.address, "--state-dir", str(tmp_path)]

    # act: a fresh member trains a little (its greedy policy scores far below 480)
    first = CliRunner().invoke(main, ["--participant-id", "cy", *common, "--episodes", "40"])
    # act: it starts again, as after a crash, and the status is asked for
    again = CliRunner().invoke(main, ["--participant-id", "cy", *common, "--episodes", "5"])
    status = CliRunner().invoke(
        main, ["--session", "pop", "--server", server.address, "--episodes", "0"]
    )

    # assert: it copied ann or bo and trains on with perturbed hyperparameters
    assert first.exit_code == 0, first.output
    exploits = records(tmp_path / "cy", "exploit")
    assert exploits and exploits[0]["donor"] in ("ann", "bo"), first.output
    donor_lr = 2e-3 if exploits[0]["donor"] == "ann" else 3e-3
    lr = exploits[0]["hyperparameters"]["lr"]  # type: ignore[index]
    assert np.isclose(lr, 0.8 * donor_lr) or np.isclose(lr, 1.2 * donor_lr)
    assert "generation 1" in first.output or "generation 2" in first.output
    assert again.exit_code == 0, again.output
    assert f"generation {exploits[-1]['generation']}" in again.output
    assert status.exit_code == 0, status.output
    assert "population (pbt)" in status.output and "lineage" in status.output
    assert "(joined)" in status.output and "gen 0" in status.output


def test_an_averaging_participant_is_refused_from_a_population_with_the_reason(
    start_server: Callable[..., InProcessServer], tmp_path: Path
) -> None:
    server = start_server()
    common = ["--server", server.address, "--state-dir", str(tmp_path), "--session", "pop"]
    member = CliRunner().invoke(
        main, ["--participant-id", "ann", *MEMBER, *common[:-2], "--episodes", "3"]
    )

    averaging = CliRunner().invoke(
        main,
        ["--participant-id", "bo", *common, "--workers", "0", "--episodes", "3"],
    )

    assert member.exit_code == 0, member.output
    assert averaging.exit_code == 1
    assert "is a population (pbt), you asked for federated" in averaging.output


def test_a_population_member_needs_a_server_and_an_evaluation() -> None:
    offline = CliRunner().invoke(main, ["--participant-id", "a", "--offline", "--mode", "pbt"])
    blind = CliRunner().invoke(
        main, ["--participant-id", "a", "--mode", "pbt", "--eval-interval", "0"]
    )

    assert offline.exit_code != 0 and "drop --offline" in offline.output
    assert blind.exit_code != 0 and "--eval-interval > 0" in blind.output
