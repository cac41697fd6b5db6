"""Learner updates per second: fedrl's learner beside a plain eager step and a plain captured one.

Two networks at each batch size: the 4 -> 256 -> 256 -> 2 MLP (CartPole's
shapes) and the Nature CNN on 4x84x84 uint8 frame stacks (Breakout's, four
actions). Only gradient steps are timed, after warm-up; rounds interleave
the variants so that load from other processes hits them alike, and the
median round is kept.

- sb3-eager: the step SB3's DQN.train() takes, written plainly: uniform
  numpy sampling, a fresh host-to-device copy per batch, max over the
  target network, smooth-L1 loss, default Adam, gradient clipping, and
  loss.item() each step (SB3 logs it: on CUDA a host sync per update).
- captured (CUDA only): the anchor, a plain Double DQN step (Huber,
  gradient clip, Adam with capturable=True, uniform replay on the device,
  indices from torch.randint there) warmed up on a side stream and captured
  in one torch.cuda.CUDAGraph.
- fedrl: our Learner with its defaults (prioritized replay, Double DQN,
  dueling, n-step targets, Huber, clip): on CUDA the device update, on the
  CPU the host update. On CUDA also fedrl-host (the host update) and
  fedrl-bf16 (bf16 autocast), and with --compile fedrl-compiled.

`--reference REV` also times the fedrl variant of git revision REV (e.g.
main) in the same run: each round runs this file twice in subprocesses,
once over this tree and once over REV's, the first of them alternating,
and the ratio of the medians is printed.

    .venv/bin/python bench/learner.py [--quick] [--device cuda] [--nets mlp,cnn]
        [--batch-sizes 32,64,256,512] [--compile] [--reference main]

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedrl.client.training.device import resolve_device
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import build_q_network
from fedrl.client.training.transitions import LearnerTransitions

ROOT = Path(__file__).resolve().parent.parent
NETS: dict[str, tuple[tuple[int, ...], int, int]] = {
    # name: (observation shape, actions, transitions in the replay)
    "mlp": ((4,), 2, 100_000),
    "cnn": ((4, 84, 84), 4, 10_000),
}
Step = Callable[[int], None]


@dataclasses.dataclass(frozen=True)
class Data:
    """A replay's worth of random transitions; image stacks follow each other as a game's do."""

    obs_shape: tuple[int, ...]
    n_actions: int
    obs: np.ndarray
    next_obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    frames: np.ndarray | None
    """uint8 [N + k, H, W] under the stacks of an image replay: stack i is frames i..i+k-1."""

    def __len__(self) -> int:
        return len(self.action)

    def transitions(self) -> LearnerTransitions:
        return LearnerTransitions(
            obs=self.obs,
            action=self.action,
            reward=self.reward,
            next_obs=self.next_obs,
            discount=self.discount,
        )


def make_data(net: str, seed: int, size: int | None = None) -> Data:
    obs_shape, n_actions, rows = NETS[net]
    rows = size or rows
    rng = np.random.default_rng(seed)
    frames = None
    if len(obs_shape) == 3:
        k = obs_shape[0]
        frames = rng.integers(0, 256, (rows + k, *obs_shape[1:]), dtype=np.uint8)
        windows = np.lib.stride_tricks.sliding_window_view(frames, k, axis=0)
        stacks = np.moveaxis(windows, -1, 1)  # [rows + 1, k, H, W], views of the frames
        obs, next_obs = stacks[:rows], stacks[1:]
    else:
        obs = rng.standard_normal((rows, *obs_shape), dtype=np.float32)
        next_obs = rng.standard_normal((rows, *obs_shape), dtype=np.float32)
    return Data(
        obs_shape=obs_shape,
        n_actions=n_actions,
        obs=obs,
        next_obs=next_obs,
        action=rng.integers(0, n_actions, size=rows),
        reward=rng.standard_normal(rows, dtype=np.float32),
        discount=np.where(rng.random(rows) < 0.02, 0.0, 0.99**3).astype(np.float32),
        frames=frames,
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_updates(step: Step, device: torch.device, updates: int) -> float:
    """Updates per second of one step(updates) call, its queued device work included."""
    synchronize(device)
    start = time.perf_counter()
    step(updates)
    synchronize(device)
    return updates / (time.perf_counter() - start)


# -- the variants ------------------------------------------------------------------------


def sb3_eager_step(batch_size: int, device: torch.device, data: Data) -> Step:
    """SB3's DQN gradient step, plain: uniform replay on the host, no tricks."""
    online = build_q_network(data.obs_shape, data.n_actions, dueling=False).to(device)
    target = build_q_network(data.obs_shape, data.n_actions, dueling=False).to(device)
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=2.3e-3)
    rng = np.random.default_rng(0)

    def run(updates: int) -> None:
        losses = []
        for _ in range(updates):
            index = rng.integers(0, len(data), size=batch_size)
            obs = torch.as_tensor(data.obs[index], device=device)
            action = torch.as_tensor(data.action[index], device=device)
            reward = torch.as_tensor(data.reward[index], device=device)
            next_obs = torch.as_tensor(data.next_obs[index], device=device)
            discount = torch.as_tensor(data.discount[index], device=device)
            with torch.no_grad():
                target_q = reward + discount * target(next_obs).max(dim=1).values
            q = online(obs).gather(1, action.unsqueeze(1)).squeeze(1)
            loss = nn.functional.smooth_l1_loss(q, target_q)
            optimizer.zero_grad()
            torch.autograd.backward(loss)
            nn.utils.clip_grad_norm_(online.parameters(), 10.0)
            optimizer.step()
            losses.append(loss.item())

    return run


def captured_step(batch_size: int, device: torch.device, data: Data) -> Step:
    """The anchor: a plain Double DQN step on a uniform device replay, in one CUDA graph."""
    online = build_q_network(data.obs_shape, data.n_actions, dueling=False).to(device)
    target = build_q_network(data.obs_shape, data.n_actions, dueling=False).to(device)
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=1e-3, capturable=True)
    size = len(data)
    if data.frames is not None:
        frames = torch.as_tensor(data.frames, device=device)
        offsets = torch.arange(data.obs_shape[0], device=device)
    else:
        obs_all = torch.as_tensor(data.obs, device=device)
        next_all = torch.as_tensor(data.next_obs, device=device)
    action_all = torch.as_tensor(data.action, device=device)
    reward_all = torch.as_tensor(data.reward, device=device)
    discount_all = torch.as_tensor(data.discount, device=device)

    def update() -> None:
        index = torch.randint(0, size, (batch_size,), device=device)
        if data.frames is not None:
            obs = frames[index.unsqueeze(1) + offsets]
            next_obs = frames[index.unsqueeze(1) + offsets + 1]
        else:
            obs, next_obs = obs_all[index], next_all[index]
        with torch.no_grad():
            best = online(next_obs).argmax(dim=1, keepdim=True)
            next_q = target(next_obs).gather(1, best).squeeze(1)
            y = reward_all[index] + discount_all[index] * next_q
        q = online(obs).gather(1, action_all[index].unsqueeze(1)).squeeze(1)
        loss = nn.functional.huber_loss(q, y)
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        nn.utils.clip_grad_norm_(online.parameters(), 10.0)
        optimizer.step()

    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            update()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        update()

    def run(updates: int) -> None:
        for _ in range(updates):
            graph.replay()

    return run


def fedrl_step(batch_size: int, device: torch.device, data: Data, **fields: object) -> Step:
    """Our Learner with its defaults, but for the batch size, the device and `fields`."""
    config = dataclasses.replace(
        LearnerConfig(),
        batch_size=batch_size,
        replay_capacity=len(data) + data.obs_shape[0],
        learning_starts=batch_size,
        device=str(device),
        **fields,
    )
    learner = Learner(obs_shape=data.obs_shape, n_actions=data.n_actions, config=config)
    learner.add(data.transitions())

    def run(updates: int) -> None:
        learner.train(updates)

    return run


def variants(device: torch.device, compile_: bool) -> dict[str, Callable[[int, Data], Step]]:
    """Each variant's factory: (batch size, data) -> a step of n updates."""
    cuda = device.type == "cuda"
    made: dict[str, Callable[[int, Data], Step]] = {
        "sb3-eager": lambda b, d: sb3_eager_step(b, device, d),
    }
    if cuda:
        made["captured"] = lambda b, d: captured_step(b, device, d)
    made["fedrl"] = lambda b, d: fedrl_step(b, device, d)
    if cuda:
        made["fedrl-host"] = lambda b, d: fedrl_step(b, device, d, device_update="off")
        made["fedrl-bf16"] = lambda b, d: fedrl_step(b, device, d, amp=True)
    if compile_:
        made["fedrl-compiled"] = lambda b, d: fedrl_step(b, device, d, compile=True)
    return made


# -- one round, and the run ---------------------------------------------------------------


def one_round(
    *,
    device: torch.device,
    nets: list[str],
    batch_sizes: list[int],
    names: list[str],
    factories: dict[str, Callable[[int, Data], Step]],
    updates: int,
    rounds: int,
    replay_rows: int | None,
    budget_s: float | None = None,
) -> list[dict[str, object]]:
    """Every variant's rate in each of `rounds` rounds, per network and batch size, batch
    sizes in the outer loop; past `budget_s` seconds the sizes not begun are skipped."""
    results: list[dict[str, object]] = []
    data = {net: make_data(net, seed=0, size=replay_rows) for net in nets}
    started = time.perf_counter()
    for batch_size in batch_sizes:
        for net in nets:
            if budget_s is not None and time.perf_counter() - started > budget_s:
                results += [
                    {"net": net, "batch": batch_size, "variant": name, "skipped": "budget"}
                    for name in names
                ]
                continue
            # A convolution step costs ~4x an MLP step on a GPU and ~50x on a CPU: fewer
            # timed updates keep rounds even.
            count = (
                max(10, updates // (4 if device.type == "cuda" else 20))
                if net == "cnn"
                else updates
            )
            steps = {name: factories[name](batch_size, data[net]) for name in names}
            for step in steps.values():  # warm-up: allocator, kernels, capture, compilation
                step(max(10, count // 10))
            rates: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(rounds):
                for name, step in steps.items():
                    rates[name].append(time_updates(step, device, count))
            results += [
                {"net": net, "batch": batch_size, "variant": name, "rates": rates[name]}
                for name in names
            ]
            del steps
    return results


@contextmanager
def reference_tree(revision: str) -> Iterator[Path]:
    """A folder whose fedrl package is `revision`'s code (laid out as installed), for
    PYTHONPATH: the same layout `make typecheck` reads the tree through."""
    with tempfile.TemporaryDirectory(prefix="fedrl-reference-") as folder:
        tree = Path(folder) / "tree"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", revision],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        package = Path(folder) / "site" / "fedrl"
        package.mkdir(parents=True)
        for part in ("server", "client", "common", "envs"):
            (package / part).symlink_to(tree / part)
        (package / "proto").symlink_to(tree / "proto" / "fedrl")
        yield package.parent


def run_worker(args: argparse.Namespace, site: Path | None) -> list[dict[str, object]]:
    """One round of the fedrl variant in a subprocess, over `site`'s fedrl or this tree's."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--device",
        args.device,
        "--nets",
        args.nets,
        "--batch-sizes",
        args.batch_sizes,
        "--variants",
        "fedrl",
        "--rounds",
        "1",
        "--updates",
        str(args.updates),
    ]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    if args.replay_rows is not None:
        command += ["--replay-rows", str(args.replay_rows)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    worker = json.loads(out.strip().splitlines()[-1])
    if site is not None and not worker["fedrl_from"].startswith(str(site)):
        raise RuntimeError(f"the reference worker imported fedrl from {worker['fedrl_from']}")
    rows: list[dict[str, object]] = worker["results"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few updates, for a smoke run")
    parser.add_argument("--device", default="auto", help='"auto", "cpu", "cuda" or "cuda:N"')
    parser.add_argument("--nets", default=None, help="mlp,cnn (default: mlp on CPU, both on CUDA)")
    parser.add_argument("--batch-sizes", default=None, help="default 64,256,512; 32,... on CUDA")
    parser.add_argument("--variants", default=None, help="a subset of the variants, by name")
    parser.add_argument("--updates", type=int, default=None, help="timed updates per round")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds; median kept")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd losses")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--replay-rows", type=int, default=None, help="transitions in replay")
    parser.add_argument("--reference", default=None, help="also time fedrl at this git revision")
    parser.add_argument("--json-out", default=None, help="also write the JSON object here")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="begin no batch size after this many seconds"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    args.device = str(device)
    cuda = device.type == "cuda"
    args.nets = args.nets or ("mlp,cnn" if cuda else "mlp")
    args.batch_sizes = args.batch_sizes or ("32,64,256,512" if cuda else "64,256,512")
    args.updates = args.updates or ((100 if args.quick else 500) * (10 if cuda else 1))
    rounds = args.rounds or (2 if args.quick else 5)
    factories = variants(device, args.compile)
    names = args.variants.split(",") if args.variants else list(factories)
    unknown = sorted(set(names) - set(factories))
    if unknown:
        parser.error(f"unknown variants {unknown}; on {device}: {', '.join(factories)}")
    nets = args.nets.split(",")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    def measure(rounds: int) -> list[dict[str, object]]:
        return one_round(
            device=device,
            nets=nets,
            batch_sizes=batch_sizes,
            names=names,
            factories=factories,
            updates=args.updates,
            rounds=rounds,
            replay_rows=args.replay_rows,
            budget_s=args.budget_s,
        )

    if args.worker:
        rows = measure(1)
        fedrl_from = str(Path(sys.modules["fedrl.client.training.learner"].__file__ or "?"))
        print(json.dumps({"results": rows, "fedrl_from": fedrl_from}))
        return

    device_name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    print(
        f"device {device} ({device_name}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, median of {rounds} rounds x {args.updates} updates "
        f"(CNN: a {'quarter' if cuda else 'twentieth'}), load average {load[0]:.1f}"
    )
    results = measure(rounds)
    reference: list[dict[str, object]] = []
    if args.reference:
        with reference_tree(args.reference) as site:
            ours: list[list[dict[str, object]]] = []
            theirs: list[list[dict[str, object]]] = []
            for round_ in range(rounds):  # ABBA: neither tree always runs first
                for tree in (None, site) if round_ % 2 == 0 else (site, None):
                    (ours if tree is None else theirs).append(run_worker(args, tree))
        reference = merge_rounds(ours, "fedrl-this-tree") + merge_rounds(
            theirs, f"fedrl-{args.reference}"
        )
    figures = [summarise(row) for row in results + reference]
    print_table(figures, names, reference=args.reference)
    report = {
        "bench": "learner",
        "device": str(device),
        "device_name": device_name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in load],
        "updates": args.updates,
        "rounds": rounds,
        "reference": args.reference,
        "results": figures,
    }
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report) + "\n", encoding="utf-8")
    print(json.dumps(report))


def merge_rounds(rounds: list[list[dict[str, object]]], variant: str) -> list[dict[str, object]]:
    """The workers' rounds as one row per network and batch size, under `variant`."""
    merged: dict[tuple[object, object], list[float]] = {}
    for rows in rounds:
        for row in rows:
            if "skipped" in row:
                continue
            rates = row["rates"]
            assert isinstance(rates, list)
            merged.setdefault((row["net"], row["batch"]), []).extend(rates)
    return [
        {"net": net, "batch": batch, "variant": variant, "rates": rates}
        for (net, batch), rates in merged.items()
    ]


def summarise(row: dict[str, object]) -> dict[str, object]:
    if "skipped" in row:
        return row
    rates = row["rates"]
    assert isinstance(rates, list)
    return {
        "net": row["net"],
        "batch": row["batch"],
        "variant": row["variant"],
        "updates_per_s": round(statistics.median(rates), 1),
        "rounds": [round(r, 1) for r in rates],
    }


def print_table(
    figures: list[dict[str, object]], names: list[str], *, reference: str | None
) -> None:
    by_key = {(f["net"], f["batch"], f["variant"]): f.get("updates_per_s") for f in figures}
    columns = list(names)
    if reference:
        columns += ["fedrl-this-tree", f"fedrl-{reference}"]
    width = max(12, *(len(c) for c in columns))
    print(
        f"{'net':>4} {'batch':>6} " + " ".join(f"{c:>{width}}" for c in columns) + "  (updates/s)"
    )
    for net, batch in dict.fromkeys((f["net"], f["batch"]) for f in figures):
        cells = [by_key.get((net, batch, c)) for c in columns]
        line = f"{net!s:>4} {batch!s:>6} " + " ".join(
            f"{c:>{width}.0f}" if isinstance(c, float) else f"{'-':>{width}}" for c in cells
        )
        ratios = []
        fedrl, eager = by_key.get((net, batch, "fedrl")), by_key.get((net, batch, "sb3-eager"))
        if isinstance(fedrl, float) and isinstance(eager, float):
            ratios.append(f"fedrl/sb3-eager {fedrl / eager:.2f}x")
        anchor = by_key.get((net, batch, "captured"))
        if isinstance(fedrl, float) and isinstance(anchor, float):
            ratios.append(f"fedrl/captured {fedrl / anchor:.2f}x")
        if reference:
            ours = by_key.get((net, batch, "fedrl-this-tree"))
            theirs = by_key.get((net, batch, f"fedrl-{reference}"))
            if isinstance(ours, float) and isinstance(theirs, float):
                ratios.append(f"this tree/{reference} {ours / theirs:.2f}x")
        print(line + "   " + ", ".join(ratios))


if __name__ == "__main__":
    main()
