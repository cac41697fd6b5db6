"""Steps per second of fedrl/Trading-v0: single env, Gymnasium's SyncVectorEnv, native vector env.

The baseline is what Gymnasium would do without our native vector env: a SyncVectorEnv over
single envs. Random actions; the synthetic market, so no data file is needed.

    .venv/bin/python bench/trading_env.py [--quick]

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from fedrl.envs import ENV_ID  # importing fedrl.envs registers fedrl/Trading-v0
from fedrl.envs.trading import TradingEnv, target_positions


def single_env_steps_per_s(seconds: float) -> float:
    env = TradingEnv()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, env.n_actions, 1 << 16).tolist()
    steps = 0

    def run(batch: int) -> int:
        nonlocal steps
        for _ in range(batch):
            _, _, terminated, truncated, _ = env.step(actions[steps % len(actions)])
            steps += 1
            if terminated or truncated:
                env.reset()
        return batch

    return _rate(run, seconds)


def vector_env_steps_per_s(num_envs: int, mode: str, seconds: float) -> float:
    envs = gym.make_vec(ENV_ID, num_envs=num_envs, vectorization_mode=mode)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    n_actions = len(target_positions(allow_short=True))
    actions = rng.integers(0, n_actions, (64, num_envs))

    def run(batch: int) -> int:
        for i in range(batch):
            envs.step(actions[i % len(actions)])
        return batch * num_envs

    rate = _rate(run, seconds)
    envs.close()
    return rate


def _rate(run: Callable[[int], int], seconds: float) -> float:
    """Env steps per second of `run`, after a short warm-up, over about `seconds`."""
    run(8)
    done, batch = 0, 8
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += run(batch)
        batch = min(batch * 2, 256)
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about 0.3 s per figure")
    args = parser.parse_args()
    seconds = 0.3 if args.quick else 3.0
    logging.basicConfig(level=logging.WARNING)

    figures = {
        "single_env": single_env_steps_per_s(seconds),
        "sync_vector_64": vector_env_steps_per_s(64, "sync", seconds),
        "native_vector_64": vector_env_steps_per_s(64, "vector_entry_point", seconds),
        "native_vector_1024": vector_env_steps_per_s(1024, "vector_entry_point", seconds),
    }
    baseline = figures["single_env"]
    print(f"{'env':<22}{'steps/s':>14}{'x single env':>14}")
    for name, rate in figures.items():
        print(f"{name:<22}{rate:>14,.0f}{rate / baseline:>14.1f}")
    print(json.dumps({"bench": "trading_env", "quick": args.quick, "steps_per_s": figures}))


if __name__ == "__main__":
    main()
