"""Pendulum-v1 (Box actions): ours (PPO, Gaussian policy) vs Stable-Baselines3 PPO, zoo settings.

"Solved" is the first greedy evaluation whose mean over 10 episodes is >= -200
within rl-baselines3-zoo's step budget for PPO on Pendulum-v1 (100,000 env
steps). Both sides use the zoo's tuned hyperparameters (4 envs, 1024 steps
per env and rollout, minibatches of 64, 10 epochs, lr 1e-3, gamma 0.9,
lambda 0.95, clip 0.2); SB3 also its generalised state-dependent exploration
(use_sde, resampled every 4 steps), ours the plain Gaussian policy with a
state-independent log-std. Evaluation, clocks and seeds as in
bench/solve_cartpole.py, whose runners this reuses.

Usage: .venv/bin/python bench/solve_pendulum.py [--quick] [--seeds 0 1 2]
The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from solve_cartpole import Outcome, median_solved, run_ours, run_sb3, warm_up
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.env_util import make_vec_env

from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.ppo_learner import PPOConfig

ENV = "Pendulum-v1"
SOLVED = -200.0
BUDGET = 100_000
ENVS = 4

# Ours: rl-baselines3-zoo's Pendulum-v1 PPO settings on fedrl's engine (PPO with
# one actor runs in the learner's process).
OURS_ENGINE = EngineConfig(env=ENV, workers=0, envs_per_worker=ENVS)
OURS_PPO = PPOConfig(
    device="cpu",
    rollout_steps=1024,
    minibatch_size=64,
    epochs=10,
    ppo_lr=1e-3,
    ppo_gamma=0.9,
    gae_lambda=0.95,
    clip_range=0.2,
)

# rl-baselines3-zoo hyperparams/ppo.yml, Pendulum-v1 (4 envs, 1e5 steps).
SB3_ZOO: dict[str, Any] = {
    "n_steps": 1024,
    "gae_lambda": 0.95,
    "gamma": 0.9,
    "n_epochs": 10,
    "ent_coef": 0.0,
    "learning_rate": 1e-3,
    "clip_range": 0.2,
    "use_sde": True,
    "sde_sample_freq": 4,
}


def sb3_pendulum(seed: int) -> BaseAlgorithm:
    envs = make_vec_env(ENV, n_envs=ENVS, seed=seed)
    return PPO("MlpPolicy", envs, seed=seed, device="cpu", verbose=0, **SB3_ZOO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seed 0 only")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=5_000, help="env steps")
    args = parser.parse_args()
    seeds = [0] if args.quick else args.seeds
    warm_up()
    load = os.getloadavg()

    ours: list[Outcome] = []
    sb3: list[Outcome] = []
    for seed in seeds:
        ours.append(
            run_ours(
                seed,
                engine_config=OURS_ENGINE,
                learner=OURS_PPO,
                solved_at=SOLVED,
                max_steps=BUDGET,
                eval_every=args.eval_every,
            )
        )
        print(f"seed {seed} ours {ours[-1]}", flush=True)
        sb3.append(
            run_sb3(
                seed,
                env=ENV,
                make_model=sb3_pendulum,
                budget=BUDGET,
                solved_at=SOLVED,
                eval_every=args.eval_every,
            )
        )
        print(f"seed {seed} sb3  {sb3[-1]}", flush=True)

    columns = f"{'wall s':>8} {'cpu s':>7} {'steps':>7} {'best':>7}"
    print(f"\n{'seed':>4} | ours {columns} | SB3 {columns}")
    for i, seed in enumerate(seeds):
        print(f"{seed:>4} |      {_fmt(ours[i])} |     {_fmt(sb3[i])}")
    medians = {
        key: (median_solved(ours, cpu=cpu), median_solved(sb3, cpu=cpu))
        for key, cpu in (("wall", False), ("cpu", True))
    }
    ratios = {key: a / b if a and b else None for key, (a, b) in medians.items()}
    for key, (a, b) in medians.items():
        print(
            f"median {key} seconds to >= {SOLVED:.0f} within {BUDGET:,} steps: ours {a}  "
            f"SB3 {b}  ratio {ratios[key]}"
        )
    print(
        json.dumps(
            {
                "bench": "solve_pendulum",
                "seeds": seeds,
                "budget": BUDGET,
                "load": load,
                "load_after": os.getloadavg(),
                "ours": [o.__dict__ for o in ours],
                "sb3": [o.__dict__ for o in sb3],
                "ours_median_s": medians["wall"][0],
                "sb3_median_s": medians["wall"][1],
                "ratio_ours_to_sb3": ratios["wall"],
                "ours_median_cpu_s": medians["cpu"][0],
                "sb3_median_cpu_s": medians["cpu"][1],
                "cpu_ratio_ours_to_sb3": ratios["cpu"],
                "all_ours_solved": all(o.solved for o in ours),
            }
        )
    )


def _fmt(o: Outcome) -> str:
    best = max(o.evaluations, default=float("nan"))
    if not o.solved:
        return f"{'unsolved':>8} {'':>7} {o.env_steps:>7} {best:>7.1f}"
    return f"{o.seconds:8.1f} {o.cpu_seconds:7.1f} {o.env_steps:>7} {best:>7.1f}"


if __name__ == "__main__":
    main()
