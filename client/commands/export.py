"""`fedrl-client export`: a greedy policy as ONNX or TorchScript, checked against the original.

The exported file stands alone. Its input "obs" is a float32 observation
batch `[B, *obs_shape]` (for a transformer, each env's window of its last k
observations: `[B, k, features + 1]`, see fedrl.client.training.obs_window).
A DQN's output is "q_values" `[B, n_actions]`, whose argmax is the greedy
action; a PPO policy's output is "action": the greedy action itself, int64
`[B]` for Discrete actions and the mean, clipped to the space, float32
`[B, d]` for Box actions. Before the file is put in place, it is loaded back
with its own runtime (torch.jit, onnxruntime or onnx's reference evaluator)
and must act like the original network on a batch of observations from the
env; a file that would act differently is never written.
"""

from __future__ import annotations

import contextlib
import importlib.util
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

from fedrl.client.training.architecture import (
    Architecture,
    ArchitectureError,
    build_from_tensors,
    infer_architecture,
)
from fedrl.client.training.policy_network import ActorCritic, GreedyPolicy
from fedrl.client.training.vector_env import EnvShape, env_shape, make_vector_env
from fedrl.common.config_cli import doc, takes_config
from fedrl.common.config_help import ConfigCommand
from fedrl.common.durable_files import replacing

Format = Literal["onnx", "torchscript"]
NamedArrays = list[tuple[str, npt.NDArray[Any]]]
INPUT_NAME, OUTPUT_NAME, ACTION_NAME = "obs", "q_values", "action"
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
class ExportReport:
    """What was written and how well it matched the original."""

    out: Path
    format: Format
    obs_shape: tuple[int, ...]
    n_actions: int
    """Discrete actions; 0 for Box actions."""
    output: str
    """What the file outputs, e.g. "'q_values' [batch, 2]; greedy action = argmax"."""
    observations: int
    """Observations both models acted on."""
    near_ties: int
    """Observations whose best two Q-values (or logits) the original itself separates by less
    than the numeric tolerance; a different pick among them is rounding, not another policy."""
    max_abs_diff: float
    """Largest difference between the exported and the original outputs (Q-values, or a Box
    policy's actions; 0 for a Discrete policy's actions, which are compared exactly)."""
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


def sample_observations(
    env_id: str | None, obs_shape: tuple[int, ...], count: int, *, seed: int, window: int = 0
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
    env = make_vector_env(env_id, envs, window=window)
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
    if window:
        # A window's step flags say which steps exist: noise must not blur them.
        noisy[..., -1] = picks[..., -1]
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


def write_onnx(net: nn.Module, example: torch.Tensor, out: Path, output: str) -> None:
    with _quiet_deprecations(), torch.no_grad():
        torch.onnx.export(
            net,
            (example,),
            str(out),
            dynamo=False,
            input_names=[INPUT_NAME],
            output_names=[output],
            dynamic_axes={INPUT_NAME: {0: "batch"}, output: {0: "batch"}},
        )


def torchscript_runner(path: Path) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
    with _quiet_deprecations():
        module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]

    def run(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            q: np.ndarray = module(torch.from_numpy(obs)).numpy()
        return q

    return run, f"torch.jit {torch.__version__}"


def onnx_runner(path: Path, output: str) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
    """onnxruntime where installed, else onnx's pure-Python reference evaluator."""
    # Optional extras, imported by name only when used: the rest of the
    # command (and TorchScript export) must work without them.
    if installed("onnxruntime"):
        onnxruntime = importlib.import_module("onnxruntime")
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return (
            lambda obs: np.asarray(session.run([output], {INPUT_NAME: obs})[0]),
            f"onnxruntime {onnxruntime.__version__}",
        )
    onnx = importlib.import_module("onnx")
    reference = importlib.import_module("onnx.reference")
    evaluator = reference.ReferenceEvaluator(onnx.load(str(path)))
    return (
        lambda obs: np.asarray(evaluator.run([output], {INPUT_NAME: obs})[0]),
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


def compare_policy(
    original: np.ndarray,
    exported: np.ndarray,
    logits: np.ndarray | None,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> tuple[int, float]:
    """(near ties, max difference) of a policy's greedy actions; ExportError if they differ.

    Discrete (with the original's `logits`): the same action everywhere except
    where the original's two best logits are within the tolerance. Box: the
    actions agree within the tolerance.
    """
    if original.shape != exported.shape:
        raise ExportError(
            f"the exported model returns shape {exported.shape}, the original {original.shape}"
        )
    if logits is None:
        diff = np.abs(exported.astype(np.float64) - original.astype(np.float64))
        max_diff = float(diff.max()) if diff.size else 0.0
        if not np.all(diff <= atol + rtol * np.abs(original)):
            raise ExportError(f"exported actions differ from the original by up to {max_diff:.3g}")
        return 0, max_diff
    tolerance = atol + rtol * np.abs(logits).max(axis=1)
    top2 = np.sort(logits, axis=1)[:, -2:] if logits.shape[1] > 1 else None
    margin = top2[:, 1] - top2[:, 0] if top2 is not None else np.full(len(logits), np.inf)
    near_tie = margin <= 2 * tolerance
    flipped = (original != exported) & ~near_tie
    if flipped.any():
        raise ExportError(
            f"the exported model picks a different greedy action on {int(flipped.sum())} of "
            f"{len(original)} observations"
        )
    return int(near_tie.sum()), 0.0


def _env_facts(env_id: str, arch: Architecture) -> EnvShape:
    env = make_vector_env(env_id, 1, window=arch.window)
    try:
        shape = env_shape(env, continuous=True)
    finally:
        env.close()
    if arch.n_actions and shape.n_actions and shape.n_actions != arch.n_actions:
        raise ExportError(
            f"{env_id} has {shape.n_actions} actions, the network {arch.n_actions}; "
            "is --env the env this model was trained on?"
        )
    problem = arch.fits(shape)
    if problem is not None:
        raise ExportError(f"{env_id}: {problem}; is --env the env this model was trained on?")
    return shape


def export_model(config: ExportConfig) -> ExportReport:
    """Writes the export next to --out, verifies it, then renames it into place."""
    if config.out.exists() and not config.overwrite:
        raise ExportError(f"{config.out} exists; pass --overwrite to replace it")
    if config.format == "onnx" and not installed("onnx"):
        raise ExportError(ONNX_INSTALL_HINT)
    loaded = load_model(config.model)
    env_id = config.env or loaded.env
    try:
        arch = infer_architecture(loaded.tensors)
        shape = _env_facts(env_id, arch) if env_id is not None else None
        obs_shape = shape.obs_shape if shape is not None else arch.input_shape()
        net = build_from_tensors(loaded.tensors, obs_shape, shape)
    except ArchitectureError as exc:
        raise ExportError(str(exc)) from exc
    observations = sample_observations(
        env_id, obs_shape, config.samples, seed=config.seed, window=arch.window
    )
    policy = net if not isinstance(net, ActorCritic) else GreedyPolicy(net).eval()
    logits = None
    with torch.no_grad():
        original = policy(torch.from_numpy(observations)).numpy()
        if isinstance(net, ActorCritic) and net.discrete:
            logits = net(torch.from_numpy(observations))[0].numpy()
    output = OUTPUT_NAME if policy is net else ACTION_NAME

    config.out.parent.mkdir(parents=True, exist_ok=True)
    # Checked in its temporary place: a file that fails the comparison never replaces `out`.
    with replacing(config.out, unique=True) as tmp:
        example = torch.from_numpy(observations[:1])
        if config.format == "onnx":
            write_onnx(policy, example, tmp, output)
            run, runtime = onnx_runner(tmp, output)
        else:
            write_torchscript(policy, example, tmp)
            run, runtime = torchscript_runner(tmp)
        exported = run(observations)
        if policy is net:
            near_ties, max_diff = compare_actions(original, exported)
        else:
            near_ties, max_diff = compare_policy(original, exported, logits)
    return ExportReport(
        out=config.out,
        format=config.format,
        obs_shape=obs_shape,
        n_actions=arch.n_actions,
        output=_describe_output(output, arch),
        observations=len(observations),
        near_ties=near_ties,
        max_abs_diff=max_diff,
        runtime=runtime,
    )


def _describe_output(name: str, arch: Architecture) -> str:
    if name == OUTPUT_NAME:
        return f"{name!r} [batch, {arch.n_actions}]; greedy action = argmax"
    if arch.n_actions:
        return f"{name!r} int64 [batch]: the greedy action"
    return f"{name!r} float32 [batch, {arch.action_dim}]: the mean action, within the bounds"


@click.command("export", cls=ConfigCommand)
@takes_config(ExportConfig)
def export_command(config: ExportConfig) -> None:
    """Write a model's greedy policy for use outside fedrl, checked to act like the original."""
    try:
        report = export_model(config)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    shape = "x".join(str(d) for d in report.obs_shape)
    ties = f", {report.near_ties} near ties" if report.near_ties else ""
    click.echo(
        f"wrote {report.out} ({report.format}): input {INPUT_NAME!r} float32 [batch, {shape}] "
        f"-> output {report.output}"
    )
    click.echo(
        f"verified with {report.runtime}: same greedy actions on {report.observations} "
        f"observations{ties}; largest difference {report.max_abs_diff:.2g}"
    )
