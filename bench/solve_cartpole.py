"""Time to solve CartPole-v1: ours vs Stable-Baselines3 DQN (rl-baselines3-zoo settings).

"Solved" is the first greedy evaluation whose mean over 10 episodes is >= 475.
Both agents are evaluated by the same code (`fedrl.client.training.evaluation`, 10
greedy episodes on env instances of its own) every `--eval-every` env steps,
and evaluation time is excluded from both clocks. The clock starts when the
agent is constructed (ours: spawning its actor included). Seeds run
interleaved, ours then SB3, on the same machine in one run.

SB3 is a bench-only dependency:
  .venv/bin/python -m pip install --constraint constraints.txt stable-baselines3

Usage: .venv/bin/python bench/solve_cartpole.py [--quick] [--seeds 0 1 2]
The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback

from fedrl.client.training.engine import EngineConfig, TrainingEngine
from fedrl.client.training.evaluation import Evaluator
from fedrl.client.training.learner import LearnerConfig

ENV = "CartPole-v1"
SOLVED = 475.0

# Ours: the defaults of `fedrl-client` except where a field is named here.
OURS_ENGINE = EngineConfig(env=ENV)
OURS_LEARNER = LearnerConfig(device="cpu")

# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1.
SB3_ZOO: dict[str, Any] = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1_000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}
SB3_TIMESTEPS = 50_000


@dataclass(frozen=True)
class Outcome:
    """One agent, one seed."""

    solved: bool
    seconds: float
    env_steps: int
    evaluations: list[float]


def run_ours(seed: int, *, max_steps: int, eval_every: int) -> Outcome:
    config = replace(OURS_ENGINE, seed=seed, eval_interval=eval_every, eval_episodes=10)
    start = time.perf_counter()
    eval_seconds = 0.0
    evaluations: list[float] = []
    with TrainingEngine(config, OURS_LEARNER) as engine:
        while engine.counters.env_steps < max_steps:
            result = engine.poll()
            if result.evaluation is None:
                continue
            eval_seconds += result.evaluation.seconds
            evaluations.append(result.evaluation.mean)
            if result.evaluation.mean >= SOLVED:
                return Outcome(
                    True,
                    time.perf_counter() - start - eval_seconds,
                    engine.counters.env_steps,
                    evaluations,
                )
        steps = engine.counters.env_steps
    return Outcome(False, time.perf_counter() - start - eval_seconds, steps, evaluations)


def run_sb3(seed: int, *, eval_every: int) -> Outcome:
    evaluator = Evaluator(
        ENV, episodes=10, seed=np.random.SeedSequence(10_000 + seed), max_steps=100_000
    )

    class EvalAndStop(BaseCallback):
        """Evaluates like ours every eval_every steps; stops training once solved."""

        def __init__(self) -> None:
            super().__init__()
            self.eval_seconds = 0.0
            self.evaluations: list[float] = []
            self.solved_at: int | None = None
            self._next = eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps < self._next:
                return True
            self._next += eval_every
            assert isinstance(self.model, DQN)
            q_net = self.model.q_net

            def q_values(obs: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
                with torch.inference_mode():
                    q: npt.NDArray[np.float32] = q_net(torch.from_numpy(obs)).numpy()
                return q

            result = evaluator.run(q_values)
            self.eval_seconds += result.seconds
            self.evaluations.append(result.mean)
            if result.mean >= SOLVED:
                self.solved_at = self.num_timesteps
                return False
            return True

    start = time.perf_counter()
    model = DQN("MlpPolicy", ENV, seed=seed, device="cpu", verbose=0, **SB3_ZOO)
    callback = EvalAndStop()
    model.learn(total_timesteps=SB3_TIMESTEPS, callback=callback)
    seconds = time.perf_counter() - start - callback.eval_seconds
    evaluator.close()
    steps = callback.solved_at if callback.solved_at is not None else model.num_timesteps
    return Outcome(callback.solved_at is not None, seconds, steps, callback.evaluations)


def median_solved(outcomes: list[Outcome]) -> float | None:
    # An unsolved seed counts as infinitely slow: the median must not hide it.
    times = [o.seconds if o.solved else float("inf") for o in outcomes]
    value = statistics.median(times)
    return None if value == float("inf") else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seed 0 only")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=1_000, help="env steps")
    parser.add_argument("--max-steps", type=int, default=100_000, help="our env-step budget")
    args = parser.parse_args()
    seeds = [0] if args.quick else args.seeds

    ours: list[Outcome] = []
    sb3: list[Outcome] = []
    for seed in seeds:
        ours.append(run_ours(seed, max_steps=args.max_steps, eval_every=args.eval_every))
        print(f"seed {seed} ours {ours[-1]}", flush=True)
        sb3.append(run_sb3(seed, eval_every=args.eval_every))
        print(f"seed {seed} sb3  {sb3[-1]}", flush=True)

    print(f"\n{'seed':>4} | {'ours s':>8} {'steps':>7} | {'SB3 s':>8} {'steps':>7}")
    for i, seed in enumerate(seeds):
        print(f"{seed:>4} | {_fmt(ours[i])} | {_fmt(sb3[i])}")
    ours_median, sb3_median = median_solved(ours), median_solved(sb3)
    ratio = ours_median / sb3_median if ours_median and sb3_median else None
    print(f"median seconds to >= {SOLVED:.0f}: ours {ours_median}  SB3 {sb3_median}  ratio {ratio}")
    print(
        json.dumps(
            {
                "bench": "solve_cartpole",
                "seeds": seeds,
                "ours": [o.__dict__ for o in ours],
                "sb3": [o.__dict__ for o in sb3],
                "ours_median_s": ours_median,
                "sb3_median_s": sb3_median,
                "ratio_ours_to_sb3": ratio,
                "all_ours_solved": all(o.solved for o in ours),
            }
        )
    )


def _fmt(o: Outcome) -> str:
    seconds = f"{o.seconds:8.1f}" if o.solved else f"{'unsolved':>8}"
    return f"{seconds} {o.env_steps:>7}"


if __name__ == "__main__":
    main()
