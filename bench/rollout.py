"""Collection throughput: env steps/s with Q-network inference, ours vs hand-written baselines.

Ours is the engine's real collection path with training switched off: actors
step a native vector env where Gymnasium has one, pick ε-greedy actions from
one batched forward pass, cut n-step transitions and hand them over through
shared memory into the learner's replay. It runs once in serial mode (one
process, the same single core as the baselines) and once with one actor
process (this machine's default on 2 cores).

Baselines, same env count and network, one process each:
  sync   gymnasium.vector.SyncVectorEnv + batched torch forward (the issue's baseline)
  async  gymnasium.vector.AsyncVectorEnv + batched torch forward

Usage: .venv/bin/python bench/rollout.py [--quick] [--env CartPole-v1] [--envs 64]
The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import replace

import gymnasium as gym
import numpy as np
import torch

from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import build_q_network
from fedrl.client.training.vector_env import env_shape


def baseline(vector_env: gym.vector.VectorEnv, seconds: float) -> float:
    """Env steps/s of the textbook loop: batched forward, ε-greedy, step."""
    shape = env_shape(vector_env)
    n_actions = shape.n_actions
    net = build_q_network(shape.obs_shape, n_actions)
    rng = np.random.default_rng(0)
    obs, _ = vector_env.reset(seed=0)
    n = vector_env.num_envs
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        with torch.inference_mode():
            greedy = net(torch.as_tensor(obs, dtype=torch.float32)).argmax(1).numpy()
        actions = np.where(rng.random(n) < 0.1, rng.integers(n_actions, size=n), greedy)
        obs, *_ = vector_env.step(actions)
        steps += n
    rate = steps / (time.perf_counter() - start)
    vector_env.close()
    return rate


def ours(env_id: str, envs: int, workers: int, seconds: float) -> float:
    """Env steps/s reaching the learner's replay through the engine (no training)."""
    config = EngineConfig(
        env=env_id, workers=workers, envs_per_worker=envs, eval_interval=0, learner_threads=1
    )
    # Training never starts: this measures collection and hand-over only.
    learner = replace(LearnerConfig(device="cpu"), learning_starts=10**9, replay_capacity=200_000)
    with TrainingEngine(config, learner) as engine:
        # Spawned actors import torch first (seconds on a busy machine).
        while engine.counters.env_steps == 0:
            engine.poll()
        warm_until = time.perf_counter() + min(2.0, seconds / 2)
        while time.perf_counter() < warm_until:
            engine.poll()
        before = engine.counters.env_steps
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            engine.poll()
        return float(engine.counters.env_steps - before) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s per measurement instead of 8")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, default=256, help="envs per actor and per baseline")
    args = parser.parse_args()
    seconds = 2.0 if args.quick else 8.0
    torch.set_num_threads(1)

    def make(cls: Callable[..., gym.vector.VectorEnv]) -> gym.vector.VectorEnv:
        return cls([lambda: gym.make(args.env) for _ in range(args.envs)])

    figures = {
        "ours_serial": ours(args.env, args.envs, 0, seconds),
        "ours_1_actor": ours(args.env, args.envs, 1, seconds),
        "sync_torch": baseline(make(gym.vector.SyncVectorEnv), seconds),
        "async_torch": baseline(make(gym.vector.AsyncVectorEnv), seconds),
    }
    base = figures["sync_torch"]
    print(f"{args.env}, {args.envs} envs, torch threads 1, {seconds:.0f} s each")
    print(f"{'collector':<14} {'env steps/s':>12} {'vs sync+torch':>14}")
    for name, rate in figures.items():
        print(f"{name:<14} {rate:>12,.0f} {rate / base:>13.2f}x")
    print(
        json.dumps(
            {
                "bench": "rollout",
                "env": args.env,
                "envs": args.envs,
                "seconds_each": seconds,
                "steps_per_s": {k: round(v) for k, v in figures.items()},
                "speedup_serial_vs_sync": round(figures["ours_serial"] / base, 2),
                "speedup_1_actor_vs_sync": round(figures["ours_1_actor"] / base, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
