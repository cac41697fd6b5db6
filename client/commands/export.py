"""`fedrl-client export`: the Q-network as ONNX or TorchScript, checked against the original.

The exported file stands alone: it maps a float32 observation batch
`[B, *obs_shape]` (input "obs") to Q-values `[B, n_actions]` (output
"q_values"), and the greedy action is their argmax. Before the file is put
in place, it is loaded back with its own runtime (torch.jit, onnxruntime or
onnx's reference evaluator) and must choose the same greedy action as the
original network on a batch of observations from the env; a file that would
act differently is never written.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import click
import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from fedrl.client.training.q_network import build_q_network, load_named_arrays
from fedrl.client.training.vector_env import env_shape, make_vector_env
from fedrl.common.config_cli import doc, takes_config
from fedrl.common.durable_files import replacing

Format = Literal["onnx", "torchscript"]
NamedArrays = list[tuple[str, npt.NDArray[Any]]]
INPUT_NAME, OUTPUT_NAME = "obs", "q_values"
ONNX_INSTALL_HINT = (
    "ONNX export needs the optional packages onnx and onnxruntime: "
    "pip install 'fedrl[export]' (or: pip install onnx onnxruntime)"
)


def installed(package: str) -> bool:
    """Whether an optional package can be imported here (without importing it)."""
    return importlib.util.find_spec(package) is not None


class ExportError(ValueError):
    """The model cannot be exported, or the export does not act like the original."""


@dataclass(frozen=True)
class ExportConfig:
    """The export command."""

    model: Path = field(
        metadata=doc(
            "A model file: model.pt or best.pt of a state dir, or a server checkpoint "
            "vNNNNNNNN.npz.",
            path="file",
        ),
    )
    format: Format = field(
        metadata=doc("onnx (any ONNX runtime) or torchscript (torch.jit.load, C++ libtorch)."),
    )
    out: Path = field(
        metadata=doc("The file to write; refused if it exists, unless --overwrite.", path="file"),
    )
    env: str = field(
        default="",
        metadata=doc(
            "Gymnasium env id for the observations; defaults to the one saved with the model."
        ),
    )
    samples: int = field(
        default=512,
        metadata=doc("Observations the exported model must act on exactly like the original."),
    )
    overwrite: bool = field(default=False, metadata=doc("Replace --out if it exists."))
    seed: int = field(default=0, metadata=doc("Seeds the verification observations."))

    def __post_init__(self) -> None:
        if self.format not in ("onnx", "torchscript"):
            raise ValueError(f"format must be onnx or torchscript, got {self.format!r}")
        if self.samples < 1:
            raise ValueError(f"samples must be at least 1, got {self.samples}")


@dataclass(frozen=True)
class LoadedModel:
    """Weights read from a model file, and what is known of where they came from."""

    tensors: NamedArrays
    env: str | None
    """The env id saved with the weights (state-dir files carry it, server checkpoints do not)."""


@dataclass(frozen=True)
class Architecture:
    """A QNetwork's shape, read back from its tensors."""

    obs_dim: int
    n_actions: int
    hidden: tuple[int, ...]
    dueling: bool


@dataclass(frozen=True)
class ExportReport:
    """What was written and how well it matched the original."""

    out: Path
    format: Format
    obs_shape: tuple[int, ...]
    n_actions: int
    observations: int
    """Observations both models acted on."""
    near_ties: int
    """Observations whose best two Q-values the original itself separates by less than the
    numeric tolerance; a different pick among them is rounding, not a different policy."""
    max_abs_diff: float
    """Largest |Q_exported − Q_original| over the batch."""
    runtime: str
    """What ran the exported file for the check."""


def load_model(path: Path) -> LoadedModel:
    """Weights from a state-dir .pt file or a server .npz checkpoint; nothing else is executed."""
    if not path.is_file():
        raise ExportError(f"{path}: no such file")
    if path.suffix == ".npz":
        return LoadedModel(_load_npz(path), env=None)
    if path.suffix == ".pt":
        return _load_pt(path)
    raise ExportError(
        f"{path}: expected model.pt or best.pt from a state dir, or a server checkpoint "
        "vNNNNNNNN.npz"
    )


def _load_pt(path: Path) -> LoadedModel:
    try:
        # weights_only: a model file from elsewhere cannot run code when loaded.
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ExportError(f"{path} cannot be loaded as a fedrl model file: {exc}") from exc
    tensors = payload.get("tensors") if isinstance(payload, dict) else None
    if not isinstance(tensors, dict) or not tensors:
        hint = " (progress.pt holds training state; export model.pt or best.pt)"
        raise ExportError(
            f"{path} holds no named tensors{hint if path.name == 'progress.pt' else ''}"
        )
    if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise ExportError(f"{path}: its 'tensors' entry holds something other than tensors")
    env = payload.get("env")
    return LoadedModel(
        [(str(name), t.numpy()) for name, t in tensors.items()],
        env=env if isinstance(env, str) and env else None,
    )


def _load_npz(path: Path) -> NamedArrays:
    try:
        # allow_pickle stays False: an object array in the file is refused, not run.
        with np.load(path, allow_pickle=False) as archive:
            return [(name, archive[name]) for name in archive.files]
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ExportError(f"{path} cannot be read as a numpy .npz checkpoint: {exc}") from exc


_TORSO = re.compile(r"torso\.(\d+)\.weight")


def infer_architecture(tensors: NamedArrays) -> Architecture:
    """Hidden widths, dueling and sizes from the tensor names and shapes of a QNetwork."""
    shapes = {name: tuple(int(d) for d in array.shape) for name, array in tensors}
    torso = sorted(
        (int(m[1]), shapes[name]) for name in shapes if (m := _TORSO.fullmatch(name)) is not None
    )
    dueling = "advantage.weight" in shapes and "value.weight" in shapes
    head = shapes.get("advantage.weight" if dueling else "head.weight")
    if head is None or len(head) != 2 or any(len(shape) != 2 for _, shape in torso):
        names = ", ".join(list(shapes)[:6])
        raise ExportError(
            "these tensors are not a fedrl Q-network (expected torso.N.weight and head.weight, "
            f"or advantage.weight and value.weight); found: {names}"
        )
    hidden = tuple(shape[0] for _, shape in torso)
    obs_dim = torso[0][1][1] if torso else head[1]
    return Architecture(obs_dim=obs_dim, n_actions=head[0], hidden=hidden, dueling=dueling)


def build_network(tensors: NamedArrays, obs_shape: tuple[int, ...]) -> nn.Module:
    """The original network in eval mode, loaded strictly (every name and shape must fit)."""
    arch = infer_architecture(tensors)
    if math.prod(obs_shape) != arch.obs_dim:
        raise ExportError(
            f"the network takes {arch.obs_dim} inputs, but observations of shape {obs_shape} "
            f"have {math.prod(obs_shape)}; is --env the env this model was trained on?"
        )
    net = build_q_network(obs_shape, arch.n_actions, hidden=arch.hidden, dueling=arch.dueling)
    try:
        load_named_arrays(net, tensors)
    except ValueError as exc:
        raise ExportError(f"the weights do not fit the network they describe: {exc}") from exc
    return net.eval()


def sample_observations(
    env_id: str | None, obs_shape: tuple[int, ...], count: int, *, seed: int
) -> npt.NDArray[np.float32]:
    """Observations to compare actions on: half visited by a random policy, half perturbed.

    States the env really visits are what the policy will see; the perturbed
    half (Gaussian noise at the visited states' scale) also covers the edges
    that a random policy rarely reaches. Without an env, standard normal draws.
    """
    rng = np.random.default_rng(seed)
    if env_id is None:
        return rng.standard_normal((count, *obs_shape)).astype(np.float32)
    visited_count = max(1, count // 2)
    envs = min(16, visited_count)
    env = make_vector_env(env_id, envs)
    try:
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        visited = [np.asarray(obs, dtype=np.float32)]
        while sum(len(v) for v in visited) < visited_count:
            obs, *_ = env.step(env.action_space.sample())
            visited.append(np.asarray(obs, dtype=np.float32))
    finally:
        env.close()
    states = np.concatenate(visited)[:visited_count]
    scale = states.std(axis=0) + 1e-3
    picks = states[rng.integers(len(states), size=count - visited_count)]
    noisy = picks + scale * rng.standard_normal(picks.shape)
    return np.concatenate([states, noisy.astype(np.float32)])


@contextlib.contextmanager
def _quiet_deprecations() -> Iterator[None]:
    # torch 2.13 marks torch.jit and the TorchScript-based ONNX exporter
    # deprecated in favour of torch.export; both still work, and the
    # replacement needs onnxscript, which we do not want as a dependency.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def write_torchscript(net: nn.Module, example: torch.Tensor, out: Path) -> None:
    with _quiet_deprecations(), torch.no_grad():
        traced = torch.jit.trace(net, example)  # type: ignore[no-untyped-call]
        torch.jit.save(traced, str(out))


def write_onnx(net: nn.Module, example: torch.Tensor, out: Path) -> None:
    with _quiet_deprecations(), torch.no_grad():
        torch.onnx.export(
            net,
            (example,),
            str(out),
            dynamo=False,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        )


def torchscript_runner(path: Path) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
    with _quiet_deprecations():
        module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]

    def run(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            q: np.ndarray = module(torch.from_numpy(obs)).numpy()
        return q

    return run, f"torch.jit {torch.__version__}"


def onnx_runner(path: Path) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
    """onnxruntime where installed, else onnx's pure-Python reference evaluator."""
    # Optional extras, imported by name only when used: the rest of the
    # command (and TorchScript export) must work without them.
    if installed("onnxruntime"):
        onnxruntime = importlib.import_module("onnxruntime")
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return (
            lambda obs: np.asarray(session.run([OUTPUT_NAME], {INPUT_NAME: obs})[0]),
            f"onnxruntime {onnxruntime.__version__}",
        )
    onnx = importlib.import_module("onnx")
    reference = importlib.import_module("onnx.reference")
    evaluator = reference.ReferenceEvaluator(onnx.load(str(path)))
    return (
        lambda obs: np.asarray(evaluator.run([OUTPUT_NAME], {INPUT_NAME: obs})[0]),
        f"onnx reference evaluator {onnx.__version__}",
    )


def compare_actions(
    original: np.ndarray, exported: np.ndarray, *, rtol: float = 1e-4, atol: float = 1e-5
) -> tuple[int, float]:
    """(near ties, max |ΔQ|); ExportError if any other greedy action differs or Q drifts.

    Exact float equality across runtimes is not to be had (kernels sum in
    different orders), so an observation whose two best Q-values the original
    separates by less than the tolerance may flip; any other flip is an error.
    """
    if original.shape != exported.shape:
        raise ExportError(
            f"the exported model returns shape {exported.shape}, the original {original.shape}"
        )
    diff = np.abs(exported.astype(np.float64) - original.astype(np.float64))
    tolerance = atol + rtol * np.abs(original)
    max_diff = float(diff.max()) if diff.size else 0.0
    if not np.all(diff <= tolerance):
        raise ExportError(f"exported Q-values differ from the original by up to {max_diff:.3g}")
    top2 = np.sort(original, axis=1)[:, -2:] if original.shape[1] > 1 else None
    margin = top2[:, 1] - top2[:, 0] if top2 is not None else np.full(len(original), np.inf)
    near_tie = margin <= 2 * tolerance.max(axis=1)
    flipped = (original.argmax(axis=1) != exported.argmax(axis=1)) & ~near_tie
    if flipped.any():
        raise ExportError(
            f"the exported model picks a different greedy action on {int(flipped.sum())} of "
            f"{len(original)} observations"
        )
    return int(near_tie.sum()), max_diff


def export_model(config: ExportConfig) -> ExportReport:
    """Writes the export next to --out, verifies it, then renames it into place."""
    if config.out.exists() and not config.overwrite:
        raise ExportError(f"{config.out} exists; pass --overwrite to replace it")
    if config.format == "onnx" and not installed("onnx"):
        raise ExportError(ONNX_INSTALL_HINT)
    loaded = load_model(config.model)
    env_id = config.env or loaded.env
    arch = infer_architecture(loaded.tensors)
    if env_id is not None:
        env = make_vector_env(env_id, 1)
        try:
            shape = env_shape(env)
        finally:
            env.close()
        obs_shape, n_actions = shape.obs_shape, shape.n_actions
        if n_actions != arch.n_actions:
            raise ExportError(
                f"{env_id} has {n_actions} actions, the network {arch.n_actions}; "
                "is --env the env this model was trained on?"
            )
    else:
        obs_shape = (arch.obs_dim,)
    net = build_network(loaded.tensors, obs_shape)
    observations = sample_observations(env_id, obs_shape, config.samples, seed=config.seed)
    with torch.no_grad():
        original = net(torch.from_numpy(observations)).numpy()

    config.out.parent.mkdir(parents=True, exist_ok=True)
    # Checked in its temporary place: a file that fails the comparison never replaces `out`.
    with replacing(config.out, unique=True) as tmp:
        example = torch.from_numpy(observations[:1])
        if config.format == "onnx":
            write_onnx(net, example, tmp)
            run, runtime = onnx_runner(tmp)
        else:
            write_torchscript(net, example, tmp)
            run, runtime = torchscript_runner(tmp)
        near_ties, max_diff = compare_actions(original, run(observations))
    return ExportReport(
        out=config.out,
        format=config.format,
        obs_shape=obs_shape,
        n_actions=arch.n_actions,
        observations=len(observations),
        near_ties=near_ties,
        max_abs_diff=max_diff,
        runtime=runtime,
    )


@click.command("export")
@takes_config(ExportConfig)
def export_command(config: ExportConfig) -> None:
    """Write the Q-network for use outside fedrl, checked to act exactly like the original."""
    try:
        report = export_model(config)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    shape = "x".join(str(d) for d in report.obs_shape)
    ties = f", {report.near_ties} near ties" if report.near_ties else ""
    click.echo(
        f"wrote {report.out} ({report.format}): input {INPUT_NAME!r} float32 [batch, {shape}] "
        f"-> output {OUTPUT_NAME!r} [batch, {report.n_actions}]; greedy action = argmax"
    )
    click.echo(
        f"verified with {report.runtime}: same greedy actions on {report.observations} "
        f"observations{ties}; max |ΔQ| {report.max_abs_diff:.2g}"
    )
