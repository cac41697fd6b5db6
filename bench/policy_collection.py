"""Collection with the transformer policy (k = 16) beside the MLP: env steps/s of one actor.

Each row is the engine's real collection path in this process, one thread (as
an actor process runs): PPO's actor (`PPOActorCore.collect`: sample from the
actor-critic, record log-probs and values, step the envs) and DQN's
(`ActorCore.collect`: ε-greedy on the Q-network, cut n-step transitions),
each with the default MLP torso and with the causal transformer over each
env's last k observations (windows kept by the vector env wrapper). The
transformer costs one forward pass over k positions per vector step, so its
rate is what a participant gives up for the longer memory.

Usage: .venv/bin/python bench/policy_collection.py [--quick] [--env CartPole-v1] [--envs 16]
The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from fedrl.client.training.actor import ActorCore, make_actor_spec
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.ppo_actor import PPOActorCore, PPOActorSpec
from fedrl.client.training.ppo_learner import PPOConfig

NETWORKS = {
    "mlp": NetworkConfig(),
    "transformer k=16": NetworkConfig(policy="transformer", context=16),
}


def ppo_actor(env: str, envs: int, network: NetworkConfig) -> Callable[[], int]:
    core = PPOActorCore(
        PPOActorSpec(
            index=0,
            env_id=env,
            data=None,
            num_envs=envs,
            seed_entropy=0,
            seed_spawn_key=(0,),
            steps_per_slot=PPOConfig().rollout_steps,
            hidden=PPOConfig().ppo_hidden,
            network=network,
        )
    )
    return lambda: core.collect().env_steps


def dqn_actor(env: str, envs: int, network: NetworkConfig) -> Callable[[], int]:
    core = ActorCore(
        make_actor_spec(
            0,
            num_actors=1,
            generation=0,
            seed_root=np.random.SeedSequence(0),
            env_id=env,
            num_envs=envs,
            exploration_base=0.4,
            exploration_alpha=7.0,
            n_step=3,
            gamma=0.99,
            hidden=(256, 256),
            dueling=True,
            steps_per_slot=8,
            network=network,
        )
    )
    return lambda: core.collect(8).env_steps


def rate(collect: Callable[[], int], seconds: float, repeats: int) -> float:
    """Median env steps/s over `repeats` windows of `seconds` (after one warm-up call)."""
    collect()
    rates = []
    for _ in range(repeats):
        steps, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            steps += collect()
        rates.append(steps / elapsed)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 s windows instead of 4")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, default=16, help="envs per actor (the default)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as an actor process runs
    seconds, repeats = (1.0, 3) if args.quick else (4.0, 3)
    load = os.getloadavg()

    figures: dict[str, dict[str, float]] = {}
    for algo, make in (("ppo", ppo_actor), ("dqn", dqn_actor)):
        for name, network in NETWORKS.items():
            figures.setdefault(algo, {})[name] = rate(
                make(args.env, args.envs, network), seconds, repeats
            )
            print(f"{algo} {name:<18} {figures[algo][name]:>10,.0f} env steps/s", flush=True)

    print(f"\n{args.env}, {args.envs} envs, one thread (load {load[0]:.1f})")
    print(f"{'actor':<6} {'mlp':>12} {'transformer k=16':>18} {'ratio':>7}")
    for algo, rates in figures.items():
        ratio = rates["transformer k=16"] / rates["mlp"]
        print(f"{algo:<6} {rates['mlp']:>12,.0f} {rates['transformer k=16']:>18,.0f} {ratio:>7.2f}")
    print(
        json.dumps(
            {
                "bench": "policy_collection",
                "env": args.env,
                "envs": args.envs,
                "env_steps_per_s": figures,
                "load": load,
                "load_after": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
