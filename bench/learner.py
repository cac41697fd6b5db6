"""Learner updates per second, side by side with a plain SB3-style DQN step.

Each variant trains a 4 -> 256 -> 256 -> 2 Q-network (CartPole's shapes) from a
replay of 100k random transitions; only the gradient steps are timed, after
warm-up. On CPU: batch 64, 256, 512. On CUDA additionally fp32 against bf16
autocast (target: >= 2,000 updates/s at batch 512 with bf16 on an H100).

The baseline is the step SB3's DQN.train() takes, written plainly: uniform
numpy sampling, a fresh host-to-device copy per batch, max over the target
network, smooth-L1 loss, default Adam, gradient clipping, and loss.item() each
step (SB3 logs it, which on CUDA is a host sync per update).

    .venv/bin/python bench/learner.py [--quick] [--device cuda] [--compile]

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fedrl.client.training.device import resolve_device
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import build_q_network
from fedrl.client.training.transitions import LearnerTransitions

OBS_SHAPE = (4,)
N_ACTIONS = 2
REPLAY = 100_000


def random_transitions(size: int, seed: int) -> LearnerTransitions:
    rng = np.random.default_rng(seed)
    return LearnerTransitions(
        obs=rng.standard_normal((size, *OBS_SHAPE), dtype=np.float32),
        action=rng.integers(0, N_ACTIONS, size=size),
        reward=rng.standard_normal(size, dtype=np.float32),
        next_obs=rng.standard_normal((size, *OBS_SHAPE), dtype=np.float32),
        discount=np.where(rng.random(size) < 0.02, 0.0, 0.99**3).astype(np.float32),
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_updates(step: Callable[[int], None], device: torch.device, updates: int) -> float:
    """Updates per second of one step(updates) call."""
    synchronize(device)
    start = time.perf_counter()
    step(updates)
    synchronize(device)
    return updates / (time.perf_counter() - start)


def baseline_step(
    batch_size: int, device: torch.device, data: LearnerTransitions
) -> Callable[[int], None]:
    """SB3's DQN gradient step, plain: uniform replay, no tricks."""
    online = build_q_network(OBS_SHAPE, N_ACTIONS, dueling=False).to(device)
    target = build_q_network(OBS_SHAPE, N_ACTIONS, dueling=False).to(device)
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=2.3e-3)
    rng = np.random.default_rng(0)

    def run(updates: int) -> None:
        losses = []
        for _ in range(updates):
            index = rng.integers(0, REPLAY, size=batch_size)
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


def learner_step(
    batch_size: int, device: torch.device, data: LearnerTransitions, *, amp: bool, compile_: bool
) -> Callable[[int], None]:
    """Our Learner with its defaults: PER, Double DQN, dueling, Huber, clipping."""
    config = dataclasses.replace(
        LearnerConfig(),
        batch_size=batch_size,
        replay_capacity=REPLAY,
        device=str(device),
        amp=amp,
        compile=compile_,
    )
    learner = Learner(obs_shape=OBS_SHAPE, n_actions=N_ACTIONS, config=config)
    learner.add(data)

    def run(updates: int) -> None:
        learner.train(updates)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few updates, for a smoke run")
    parser.add_argument("--device", default="auto", help='"auto", "cpu", "cuda" or "cuda:N"')
    parser.add_argument("--batch-sizes", default="64,256,512")
    parser.add_argument("--updates", type=int, default=None, help="timed updates per variant")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd losses")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds; best is kept")
    args = parser.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    updates = args.updates or ((100 if args.quick else 500) * (10 if cuda else 1))
    repeats = args.repeats or (2 if args.quick else 3)
    data = random_transitions(REPLAY, seed=0)

    # (name, factory): the variants to time at each batch size.
    variants: list[tuple[str, Callable[[int], Callable[[int], None]]]] = [
        ("baseline", lambda b: baseline_step(b, device, data)),
        ("learner-fp32", lambda b: learner_step(b, device, data, amp=False, compile_=False)),
    ]
    if cuda:
        variants.append(
            ("learner-bf16", lambda b: learner_step(b, device, data, amp=True, compile_=False))
        )
    if args.compile:
        variants.append(
            ("learner-compiled", lambda b: learner_step(b, device, data, amp=cuda, compile_=True))
        )

    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    device_name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    print(
        f"device {device} ({device_name}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, best of {repeats} x {updates} updates"
    )
    print(f"{'batch':>6} " + " ".join(f"{name:>17}" for name, _ in variants) + "   (updates/s)")
    results: list[dict[str, object]] = []
    for batch_size in batch_sizes:
        steps = {name: factory(batch_size) for name, factory in variants}
        for step in steps.values():  # warm-up: allocator, kernels, compilation
            step(max(10, updates // 10))
        # Rounds interleave the variants so that load from other processes
        # hits them alike; the best round is the least disturbed one.
        best = dict.fromkeys(steps, 0.0)
        for _ in range(repeats):
            for name, step in steps.items():
                best[name] = max(best[name], time_updates(step, device, updates))
        for name, rate in best.items():
            results.append({"batch": batch_size, "variant": name, "updates_per_s": round(rate, 1)})
        print(
            f"{batch_size:>6} "
            + " ".join(f"{best[name]:>17.0f}" for name, _ in variants)
            + f"   learner-fp32/baseline {best['learner-fp32'] / best['baseline']:.2f}x"
        )
    print(
        json.dumps(
            {
                "bench": "learner",
                "device": str(device),
                "device_name": device_name,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "updates": updates,
                "repeats": repeats,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
