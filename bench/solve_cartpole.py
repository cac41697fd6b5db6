"""Time to solve CartPole-v1: ours vs Stable-Baselines3 (rl-baselines3-zoo settings), DQN and PPO.

"Solved" is the first greedy evaluation whose mean over 10 episodes is >= 475.
Both agents are evaluated by the same code (`fedrl.client.training.evaluation`, 10
greedy episodes on env instances of its own) every `--eval-every` env steps,
and evaluation time is excluded from both clocks. The clock starts when the
agent is constructed (ours: spawning its actor included). Seeds run
interleaved, ours then SB3, on the same machine in one run. Ours runs with
`fedrl-client`'s defaults (`--algo dqn`, or `--algo ppo --anneal-steps 100000`:
the zoo's learning-rate schedule over its budget); SB3 with the zoo's tuned
CartPole-v1 settings for the same algorithm and the zoo's step budget.

SB3 is a bench-only dependency:
  .venv/bin/python -m pip install --constraint constraints.txt stable-baselines3

Usage: .venv/bin/python bench/solve_cartpole.py [--quick] [--algo dqn ppo] [--seeds 0 1 2]
The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil
import torch
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.evaluation import Evaluator
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.policy_network import ActorCritic
from fedrl.client.training.ppo_learner import PPOConfig

ENV = "CartPole-v1"
SOLVED = 475.0

# Ours: the defaults of `fedrl-client` except where a field is named here.
OURS_ENGINE = EngineConfig(env=ENV)
OURS_LEARNER = LearnerConfig(device="cpu")
# The zoo anneals PPO's learning rate over its 100k-step budget; ours anneals
# over the same horizon (the client's default is a constant rate, for runs of
# any length: 20 % more steps to solve CartPole, measured over 8 seeds).
OURS_PPO = PPOConfig(device="cpu", anneal_steps=100_000)

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


def _linear(start: float) -> Any:
    """The zoo's "lin_" schedules: SB3 passes the remaining progress, 1 down to 0."""
    return lambda remaining: remaining * start


# rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 (8 envs, 1e5 steps).
SB3_PPO_ZOO: dict[str, Any] = {
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": _linear(1e-3),
    "clip_range": _linear(0.2),
}
SB3_PPO_ENVS = 8
SB3_PPO_TIMESTEPS = 100_000


@dataclass(frozen=True)
class Outcome:
    """One agent, one seed."""

    solved: bool
    seconds: float
    """Wall time, evaluations excluded."""
    cpu_seconds: float
    """CPU time of the process and its children (our actors), evaluations excluded: on a
    machine shared with others this is the steadier figure."""
    env_steps: int
    evaluations: list[float]


class Clock:
    """Wall and CPU seconds since it was made, with the time spent `paused()` taken out."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._wall, self._cpu = time.perf_counter(), self._cpu_now()

    def _cpu_now(self) -> float:
        times = self._process.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        for child in self._process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
        return float(total)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), self._cpu_now()
        try:
            yield
        finally:
            self._wall += time.perf_counter() - wall
            self._cpu += self._cpu_now() - cpu

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self._wall, self._cpu_now() - self._cpu


def evaluator_for(env: str, seed: int) -> Evaluator:
    """The evaluator both sides of a seed are scored by: same envs, same starts."""
    return Evaluator(
        env, episodes=10, seed=np.random.SeedSequence(10_000 + seed), max_steps=100_000
    )


def run_ours(
    seed: int,
    *,
    engine_config: EngineConfig,
    learner: LearnerConfig | PPOConfig,
    solved_at: float,
    max_steps: int,
    eval_every: int,
) -> Outcome:
    """Our engine until a greedy evaluation reaches `solved_at` or `max_steps` env steps."""
    config = replace(engine_config, seed=seed, eval_interval=0)
    evaluator = evaluator_for(config.env, seed)
    evaluations: list[float] = []
    clock = Clock()
    solved = False
    with TrainingEngine(config, learner) as engine:
        next_eval = eval_every
        while engine.counters.env_steps < max_steps and not solved:
            engine.poll()
            if engine.counters.env_steps < next_eval:
                continue
            next_eval = (engine.counters.env_steps // eval_every + 1) * eval_every
            with clock.paused():
                evaluations.append(evaluator.run_policy(ours_greedy(engine)).mean)
            solved = evaluations[-1] >= solved_at
        seconds, cpu_seconds = clock.read()
        steps = engine.counters.env_steps
    evaluator.close()
    return Outcome(solved, seconds, cpu_seconds, steps, evaluations)


def ours_greedy(engine: TrainingEngine) -> Any:
    net = engine.learner.online

    def act(obs: npt.NDArray[np.float32]) -> npt.NDArray[np.generic]:
        with torch.inference_mode():
            batch = torch.from_numpy(obs)
            if isinstance(net, ActorCritic):
                return np.asarray(net.greedy(batch).numpy())
            return np.asarray(net(batch).argmax(dim=1).numpy())

    return act


def run_sb3(
    seed: int,
    *,
    env: str,
    make_model: Callable[[int], BaseAlgorithm],
    budget: int,
    solved_at: float,
    eval_every: int,
) -> Outcome:
    """An SB3 model until a greedy evaluation reaches `solved_at` or its step budget."""
    evaluator = evaluator_for(env, seed)

    class EvalAndStop(BaseCallback):
        """Evaluates like ours every eval_every steps; stops training once solved."""

        def __init__(self, clock: Clock) -> None:
            super().__init__()
            self.clock = clock
            self.evaluations: list[float] = []
            self.solved_at: int | None = None
            self._next = eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps < self._next:
                return True
            self._next += eval_every
            with self.clock.paused():
                result = evaluator.run_policy(greedy(self.model))
            self.evaluations.append(result.mean)
            if result.mean >= solved_at:
                self.solved_at = self.num_timesteps
                return False
            return True

    clock = Clock()
    model = make_model(seed)
    callback = EvalAndStop(clock)
    model.learn(total_timesteps=budget, callback=callback)
    seconds, cpu_seconds = clock.read()
    evaluator.close()
    steps = callback.solved_at if callback.solved_at is not None else model.num_timesteps
    return Outcome(
        callback.solved_at is not None, seconds, cpu_seconds, steps, callback.evaluations
    )


def sb3_cartpole(algo: str, seed: int) -> BaseAlgorithm:
    if algo == "ppo":
        envs = make_vec_env(ENV, n_envs=SB3_PPO_ENVS, seed=seed)
        return PPO("MlpPolicy", envs, seed=seed, device="cpu", verbose=0, **SB3_PPO_ZOO)
    return DQN("MlpPolicy", ENV, seed=seed, device="cpu", verbose=0, **SB3_ZOO)


def greedy(model: BaseAlgorithm) -> Any:
    """SB3's greedy action: the Q-network's argmax, or the policy's mode."""
    if isinstance(model, DQN):
        q_net = model.q_net

        def argmax(obs: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]:
            with torch.inference_mode():
                return np.asarray(q_net(torch.from_numpy(obs)).argmax(dim=1).numpy())

        return argmax
    return lambda obs: model.predict(obs, deterministic=True)[0]


def warm_up() -> None:
    """Pay one-time import costs before any clock starts.

    torch imports torch._dynamo the first time an optimizer is made (~1 CPU s
    here): whichever agent came first in the process would pay it alone.
    """
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])


def median_solved(outcomes: list[Outcome], *, cpu: bool = False) -> float | None:
    # An unsolved seed counts as infinitely slow: the median must not hide it.
    times = [(o.cpu_seconds if cpu else o.seconds) if o.solved else float("inf") for o in outcomes]
    value = statistics.median(times)
    return None if value == float("inf") else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seed 0 only")
    parser.add_argument("--algo", nargs="+", choices=["dqn", "ppo"], default=["dqn", "ppo"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=1_000, help="env steps")
    parser.add_argument("--max-steps", type=int, default=100_000, help="our env-step budget")
    args = parser.parse_args()
    seeds = [0] if args.quick else args.seeds

    warm_up()
    figures: dict[str, Any] = {"bench": "solve_cartpole", "seeds": seeds, "load": os.getloadavg()}
    for algo in args.algo:
        ours: list[Outcome] = []
        sb3: list[Outcome] = []
        for seed in seeds:
            ours.append(
                run_ours(
                    seed,
                    engine_config=OURS_ENGINE,
                    learner=OURS_PPO if algo == "ppo" else OURS_LEARNER,
                    solved_at=SOLVED,
                    max_steps=args.max_steps,
                    eval_every=args.eval_every,
                )
            )
            print(f"{algo} seed {seed} ours {ours[-1]}", flush=True)
            sb3.append(
                run_sb3(
                    seed,
                    env=ENV,
                    make_model=functools.partial(sb3_cartpole, algo),
                    budget=SB3_PPO_TIMESTEPS if algo == "ppo" else SB3_TIMESTEPS,
                    solved_at=SOLVED,
                    eval_every=args.eval_every,
                )
            )
            print(f"{algo} seed {seed} sb3  {sb3[-1]}", flush=True)

        print(f"\n{algo.upper()}")
        columns = f"{'wall s':>8} {'cpu s':>7} {'steps':>7}"
        print(f"{'seed':>4} | ours {columns} | SB3 {columns}")
        for i, seed in enumerate(seeds):
            print(f"{seed:>4} |      {_fmt(ours[i])} |     {_fmt(sb3[i])}")
        medians = {
            key: (median_solved(ours, cpu=cpu), median_solved(sb3, cpu=cpu))
            for key, cpu in (("wall", False), ("cpu", True))
        }
        ratios = {key: a / b if a and b else None for key, (a, b) in medians.items()}
        for key, (a, b) in medians.items():
            print(
                f"median {key} seconds to >= {SOLVED:.0f}: ours {a}  SB3 {b}  ratio {ratios[key]}"
            )
        figures[algo] = {
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
    figures["load_after"] = os.getloadavg()
    print(json.dumps(figures))


def _fmt(o: Outcome) -> str:
    if not o.solved:
        return f"{'unsolved':>8} {'':>7} {o.env_steps:>7}"
    return f"{o.seconds:8.1f} {o.cpu_seconds:7.1f} {o.env_steps:>7}"


if __name__ == "__main__":
    main()
