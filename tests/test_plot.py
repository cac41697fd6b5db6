"""`fedrl-client plot`: non-empty PNGs from recorded metrics files and from a server's state."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from fedrl.client.commands.plot import (
    PlotConfig,
    moving_average,
    plot,
    plot_command,
    read_metrics,
    step_rates,
)
from fedrl.client.commands.state_dir import Autosaver, ModelIdentity, StateDir
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.common.status_file import status_to_json
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.cli import main as fedrl_server
from tests.support.population import enroll, join_population, population_stub, report
from tests.support.server_harness import (
    InProcessServer,
    join,
    make_spec,
    push,
    seed,
    server_config,
    wait_for_version,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    image = pytest.importorskip("matplotlib.image").imread(path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # something is drawn, not a blank canvas


def record_training(root: Path, participant_id: str = "Макар") -> Path:
    """A real offline run of a few seconds, recorded by the state dir's autosave."""
    engine = TrainingEngine(
        EngineConfig(workers=0, envs_per_worker=4, eval_interval=600, eval_episodes=2),
        LearnerConfig(hidden=(32,), learning_starts=200, batch_size=32, device="cpu"),
    )
    state = StateDir(root, participant_id, ModelIdentity("CartPole-v1", "dqn/dueling-mlp-32"))
    try:
        autosave = Autosaver(state, engine, model_every=10, progress_every=50)
        engine.start()
        engine.run(lambda c: c.episodes >= 40 and c.best_eval is not None, on_poll=autosave)
    finally:
        engine.close()
        state.close()
    return state.path


def write_documented_metrics(path: Path) -> None:
    """Every record kind docs/monitoring.md documents, as a long run would write them."""
    rng = np.random.default_rng(0)
    records: list[dict[str, Any]] = []
    steps = 0
    for episode in range(1, 301):
        length = int(20 + episode * 0.5)
        steps += length
        now = 1_700_000_000 + steps / 5000 + (3600 if episode > 150 else 0)  # a resumed run
        records.append(
            {
                "kind": "episode",
                "time": now,
                "episode": episode,
                "return": float(length),
                "length": length,
                "env_steps": steps,
            }
        )
        if episode % 10 == 0:
            records.append(
                {
                    "kind": "train",
                    "time": now,
                    "episode": episode,
                    "env_steps": steps,
                    "updates": steps // 2,
                    "loss": float(1.0 / episode + rng.random() * 0.01),
                    "q_mean": float(episode) / 10,
                    "replay_size": min(steps, 100_000),
                }
            )
        if episode % 50 == 0:
            records.append(
                {
                    "kind": "eval",
                    "time": now,
                    "episode": episode,
                    "env_steps": steps,
                    "updates": steps // 2,
                    "mean": float(episode),
                    "std": 5.0,
                    "best": float(episode),
                }
            )
            if episode == 200:
                records.append(
                    {
                        "kind": "exploit",
                        "time": now,
                        "episode": episode,
                        "env_steps": steps,
                        "generation": 1,
                        "donor": "小明",
                        "donor_generation": 0,
                        "hyperparameters": {"lr": 8e-4, "gamma": 0.9875},
                    }
                )
            records.append(
                {
                    "kind": "sync",
                    "time": now,
                    "episode": episode,
                    "env_steps": steps,
                    "version": episode // 50,
                    "sequence": episode // 50,
                    "active_participants": 2,
                }
            )
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
    path.write_text(text + '\n{"kind": "episode", "ti', encoding="utf-8")  # killed mid-line


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One recorded run shared by the tests that only read it (it takes a few seconds)."""
    return record_training(tmp_path_factory.mktemp("recorded") / "state")


def test_plot_writes_non_empty_pngs_from_a_recorded_training_run(
    recorded: Path, tmp_path: Path
) -> None:
    out = tmp_path / "png"

    written, _, log = plot(PlotConfig(state_dir=recorded.parent, out=out))

    names = {p.name for p in written}
    assert {"returns.png", "eval.png", "speed.png"} <= names
    assert all(p.parent == out for p in written)
    for path in written:
        assert_png(path)
    assert log is not None and log.skipped == 0


def test_plot_writes_every_participant_curve_from_a_documented_metrics_file(
    tmp_path: Path,
) -> None:
    write_documented_metrics(tmp_path / "metrics.jsonl")
    out = tmp_path / "png"

    result = CliRunner().invoke(plot_command, ["--state-dir", str(tmp_path), "--out", str(out)])

    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "eval.png",
        "loss.png",
        "returns.png",
        "speed.png",
    ]
    for path in out.iterdir():
        assert_png(path)
    assert "skipped 1 unreadable line(s)" in result.output
    assert "line 344: not JSON" in result.output


# CI machines often have no CJK font; the figure is still written, with boxes.
@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")
def test_plot_draws_the_global_model_per_version_from_the_server_state(tmp_path: Path) -> None:
    spec = make_spec([(4,)])
    config = server_config(tmp_path / "data", buffer_size=2)
    with InProcessServer(config) as server:
        stub = server.stub()
        for pid in ("Макар", "小明"):
            join(stub, pid, spec)
        seed(stub, "Макар", spec, [np.zeros(4, np.float32)])
        for version in (1, 2, 3):  # both push from the newest version, which they merge into
            for pid in ("Макар", "小明"):
                push(
                    stub,
                    pid,
                    spec,
                    [np.full(4, 0.1, np.float32)],
                    sequence=version,
                    base_version=version - 1,
                    metrics=pb.UpdateMetrics(
                        mean_return=10.0 * version, base_eval_return=20.0 * version
                    ),
                )
            wait_for_version(stub, version)
        out = tmp_path / "png"

        # The operator's way: the server's status as a file, every version in it.
        exported = CliRunner().invoke(
            fedrl_server,
            ["status", "--data-dir", str(config.data_dir), "--versions", "0", "--json"],
        )
        assert exported.exit_code == 0, exported.output
        status_file = tmp_path / "status.json"
        status_file.write_text(exported.stdout, encoding="utf-8")
        from_data_dir, missing, log = plot(
            PlotConfig(state_dir=tmp_path / "none", server=str(status_file), out=out / "dir")
        )
        result = CliRunner().invoke(
            plot_command,
            [
                "--state-dir",
                str(tmp_path / "none"),
                "--server",
                server.address,
                "--participant-id",
                "小明",
                "--out",
                str(out / "rpc"),
            ],
        )

    assert [p.name for p in from_data_dir] == ["global-default.png"]
    assert_png(from_data_dir[0])
    assert missing == [] and log is None
    assert result.exit_code == 0, result.output
    assert_png(out / "rpc" / "global-default.png")


def test_plot_draws_a_populations_hyperparameter_history_and_lineage(tmp_path: Path) -> None:
    spec = make_spec([(4,)])
    config = server_config(tmp_path / "data", pbt_ready_steps=100, pbt_resample_probability=0.0)
    with InProcessServer(config) as server:
        federation, population = server.stub(), population_stub(server.address)
        for pid, score in (("Макар", 300.0), ("小明", 200.0), ("ann", 10.0)):
            join_population(federation, pid, spec)
            enroll(population, pid)
            report(population, pid, spec, [np.zeros(4, np.float32)], sequence=1, score=score)
        decided = report(
            population, "ann", spec, [np.ones(4, np.float32)], sequence=2, env_steps=100, score=5.0
        )
        exported = CliRunner().invoke(
            fedrl_server, ["status", "--data-dir", str(config.data_dir), "--json"]
        )
    status_file = tmp_path / "status.json"
    status_file.write_text(exported.stdout, encoding="utf-8")

    written, missing, _ = plot(
        PlotConfig(state_dir=tmp_path / "none", server=str(status_file), out=tmp_path / "png")
    )

    assert decided.decision == "exploit"
    assert [p.name for p in written] == ["population-default.png"] and missing == []
    assert_png(written[0])


def test_server_address_without_a_participant_id_says_what_to_pass(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        plot_command, ["--state-dir", str(tmp_path), "--server", "127.0.0.1:1"]
    )

    assert result.exit_code == 1
    assert "pass --participant-id (or --bundle)" in result.output


def test_several_participants_without_an_id_is_an_error_naming_them(tmp_path: Path) -> None:
    for name in ("alice", "bob"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("", encoding="utf-8")

    result = CliRunner().invoke(plot_command, ["--state-dir", str(tmp_path)])

    assert result.exit_code == 1
    assert "several participants (alice, bob); pick --participant-id" in result.output


def test_participant_is_found_by_unicode_id_under_the_state_root(tmp_path: Path) -> None:
    participant = tmp_path / "Макар"
    participant.mkdir()
    write_documented_metrics(participant / "metrics.jsonl")
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "metrics.jsonl").write_text("", encoding="utf-8")

    written, _, _ = plot(PlotConfig(state_dir=tmp_path, participant_id="Макар"))

    assert {p.parent for p in written} == {participant / "plots"}


def test_nothing_to_plot_says_which_option_to_pass(tmp_path: Path) -> None:
    result = CliRunner().invoke(plot_command, ["--state-dir", str(tmp_path / "missing")])

    assert result.exit_code == 1
    assert "nothing to plot" in result.output
    assert "--state-dir" in result.output


def test_without_matplotlib_the_command_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_documented_metrics(tmp_path / "metrics.jsonl")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails

    result = CliRunner().invoke(plot_command, ["--state-dir", str(tmp_path)])

    assert result.exit_code == 1
    assert "pip install 'fedrl[plot]'" in result.output


def test_metrics_lines_parse_and_carry_the_documented_fields(recorded: Path) -> None:
    log = read_metrics(recorded / "metrics.jsonl")

    assert log.skipped == 0
    episodes, evals = log.kind("episode"), log.kind("eval")
    assert len(episodes) >= 40 and evals
    for record in episodes:
        assert {"kind", "time", "episode", "env_steps", "return", "length"} <= set(record)
    for record in evals:
        assert {"kind", "time", "episode", "env_steps", "updates", "mean", "std", "best"} <= set(
            record
        )
    trains = log.kind("train")
    assert trains
    for record in trains:
        assert {
            "kind",
            "time",
            "episode",
            "env_steps",
            "updates",
            "episodes",
            "replay_size",
        } <= set(record)
    assert any("loss" in record for record in trains)
    assert [r["episode"] for r in episodes] == list(range(1, len(episodes) + 1))


def test_moving_average_is_a_trailing_mean_from_the_first_value() -> None:
    values = np.array([2.0, 4.0, 6.0, 8.0])

    np.testing.assert_allclose(moving_average(values, 2), [2.0, 3.0, 5.0, 7.0])


def test_step_rates_leave_out_the_pause_of_a_stopped_run() -> None:
    times = np.array([0.0, 1.0, 2.0, 1000.0, 1001.0])
    steps = np.array([0.0, 100.0, 200.0, 200.0, 300.0])

    _, rate = step_rates(times, steps, bins=10)

    np.testing.assert_allclose(rate, [100.0, 100.0, 100.0])


def test_a_server_data_dir_is_refused_with_the_command_that_exports_its_status(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(
        plot_command, ["--state-dir", str(tmp_path / "none"), "--server", str(tmp_path)]
    )

    assert result.exit_code == 1
    assert f"fedrl-server status --data-dir {tmp_path} --versions 0 --json" in result.output


def test_a_status_file_plots_only_the_session_asked_for(tmp_path: Path) -> None:
    # prepare
    versions = [pb.VersionState(version=v, contributors=["Макар"]) for v in range(3)]
    reply = pb.StatusReply(
        sessions=[pb.SessionState(session=name, versions=versions) for name in ("a", "b")]
    )
    status = tmp_path / "status.json"
    status.write_text(status_to_json(reply), encoding="utf-8")
    args = ["--state-dir", str(tmp_path / "none"), "--server", str(status), "--out", str(tmp_path)]

    # act
    only_b = CliRunner().invoke(plot_command, [*args, "--session", "b"])
    missing = CliRunner().invoke(plot_command, [*args, "--session", "c"])

    # assert
    assert only_b.exit_code == 0, only_b.output
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["global-b.png"]
    assert missing.exit_code == 1
    assert "no session named 'c'" in missing.output


def test_a_file_that_is_not_a_status_says_what_writes_one(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    status.write_text('{"sessions": 3}', encoding="utf-8")

    result = CliRunner().invoke(
        plot_command, ["--state-dir", str(tmp_path / "none"), "--server", str(status)]
    )

    assert result.exit_code == 1
    assert "`fedrl-server status --json` writes one" in result.output
