"""`fedrl-client export`: ONNX and TorchScript files that act exactly like the original network."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from fedrl.client.commands import export
from fedrl.client.commands.export import ExportConfig, ExportError, compare_actions, export_model
from fedrl.client.commands.state_dir import ModelIdentity, StateDir
from fedrl.client.training.counters import Counters
from fedrl.client.training.q_network import architecture_name, build_q_network, named_arrays
from fedrl.server.storage.model_store import ModelStore


def saved_model(tmp_path: Path, *, dueling: bool = True) -> tuple[nn.Module, Path]:
    """A CartPole Q-network saved as a participant's model.pt, the way training saves it."""
    torch.manual_seed(7)
    net = build_q_network((4,), 2, hidden=(32, 32), dueling=dueling).eval()
    identity = ModelIdentity("CartPole-v1", architecture_name((32, 32), dueling))
    state = StateDir(tmp_path / "state", "Макар", identity)
    state.save_model(named_arrays(net), Counters(episodes=10))
    return net, state.path / "model.pt"


def fresh_observations(count: int = 300) -> np.ndarray:
    # Not the export's own verification batch: a different seed and a wider spread.
    rng = np.random.default_rng(123)
    return (rng.standard_normal((count, 4)) * [1.0, 2.0, 0.2, 2.0]).astype(np.float32)


def greedy(net: nn.Module, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        actions: np.ndarray = net(torch.from_numpy(obs)).argmax(dim=1).numpy()
    return actions


def load_torchscript(path: Path) -> nn.Module:
    # torch 2.13 deprecates torch.jit (still supported); the file is what users load.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module: nn.Module = torch.jit.load(str(path))
    return module


def test_onnx_export_round_trip_gives_identical_greedy_actions(tmp_path: Path) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    net, model = saved_model(tmp_path)
    out = tmp_path / "q.onnx"

    report = export_model(ExportConfig(model=model, format="onnx", out=out))

    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    obs = fresh_observations()
    (q,) = session.run(["q_values"], {"obs": obs})
    np.testing.assert_array_equal(q.argmax(axis=1), greedy(net, obs))
    assert report.near_ties == 0
    assert report.observations == 512


def test_onnx_is_verified_by_the_reference_evaluator_without_onnxruntime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    _, model = saved_model(tmp_path)
    monkeypatch.setattr(export, "installed", lambda package: package != "onnxruntime")

    report = export_model(
        ExportConfig(model=model, format="onnx", out=tmp_path / "q.onnx", samples=64)
    )

    assert report.runtime.startswith("onnx reference evaluator")
    assert (tmp_path / "q.onnx").stat().st_size > 0


def test_torchscript_export_round_trip_gives_identical_greedy_actions(tmp_path: Path) -> None:
    net, model = saved_model(tmp_path, dueling=False)
    out = tmp_path / "q.pt"

    export_model(ExportConfig(model=model, format="torchscript", out=out))

    loaded = load_torchscript(out)
    obs = fresh_observations()
    np.testing.assert_array_equal(greedy(loaded, obs), greedy(net, obs))


def test_server_checkpoint_exports_with_the_env_named_on_the_command_line(
    tmp_path: Path,
) -> None:
    net, _ = saved_model(tmp_path)
    checkpoint = ModelStore(tmp_path / "models").write(3, named_arrays(net))
    out = tmp_path / "global.pt"

    report = export_model(
        ExportConfig(model=checkpoint, format="torchscript", out=out, env="CartPole-v1")
    )

    assert (report.obs_shape, report.n_actions) == ((4,), 2)
    obs = fresh_observations()
    np.testing.assert_array_equal(greedy(load_torchscript(out), obs), greedy(net, obs))


def test_model_for_another_env_is_refused_with_the_reason(tmp_path: Path) -> None:
    _, model = saved_model(tmp_path)

    with pytest.raises(ExportError, match=r"Acrobot-v1 has 3 actions, the network 2"):
        export_model(
            ExportConfig(model=model, format="torchscript", out=tmp_path / "q.pt", env="Acrobot-v1")
        )
    assert not (tmp_path / "q.pt").exists()


def test_existing_output_is_kept_unless_overwrite(tmp_path: Path) -> None:
    _, model = saved_model(tmp_path)
    out = tmp_path / "q.pt"
    out.write_bytes(b"someone's file")

    with pytest.raises(ExportError, match="exists; pass --overwrite"):
        export_model(ExportConfig(model=model, format="torchscript", out=out))
    assert out.read_bytes() == b"someone's file"

    export_model(ExportConfig(model=model, format="torchscript", out=out, overwrite=True))
    assert out.read_bytes() != b"someone's file"


def test_progress_file_is_refused_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "progress.pt"
    torch.save({"format": 1, "learner": {}}, path)

    with pytest.raises(ExportError, match=r"progress\.pt holds training state"):
        export_model(ExportConfig(model=path, format="torchscript", out=tmp_path / "q.pt"))


def test_tensors_that_are_no_q_network_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "v00000001.npz"
    np.savez(path, conv=np.zeros((3, 3, 3, 3), dtype=np.float32))

    with pytest.raises(ExportError, match="not a fedrl Q-network"):
        export_model(ExportConfig(model=path, format="torchscript", out=tmp_path / "q.pt"))


def test_a_flipped_greedy_action_fails_the_check() -> None:
    original = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    exported = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)

    with pytest.raises(ExportError, match="differ"):
        compare_actions(original, exported)


def test_a_near_tie_may_flip_without_failing_the_check() -> None:
    original = np.array([[1.0, 1.0 + 1e-7], [0.0, 5.0]], dtype=np.float32)
    exported = np.array([[1.0 + 1e-7, 1.0], [0.0, 5.0]], dtype=np.float32)

    near_ties, _ = compare_actions(original, exported)

    assert near_ties == 1


def test_onnx_without_its_packages_says_how_to_install_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, model = saved_model(tmp_path)
    monkeypatch.setattr(export, "installed", lambda package: package != "onnx")

    result = CliRunner().invoke(
        export.export_command,
        ["--model", str(model), "--format", "onnx", "--out", str(tmp_path / "q.onnx")],
    )

    assert result.exit_code == 1
    assert "pip install 'fedrl[export]'" in result.output
    assert not (tmp_path / "q.onnx").exists()


def test_command_reports_the_file_and_its_verification(tmp_path: Path) -> None:
    _, model = saved_model(tmp_path)
    out = tmp_path / "out" / "q.pt"

    result = CliRunner().invoke(
        export.export_command,
        ["--model", str(model), "--format", "torchscript", "--out", str(out)],
    )

    assert result.exit_code == 0, result.output
    assert f"wrote {out} (torchscript)" in result.output
    assert "same greedy actions on 512 observations" in result.output
    assert [p.name for p in out.parent.iterdir()] == ["q.pt"]
