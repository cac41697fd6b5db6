"""Collection speed on Atari with CNN inference: fedrl's frame actor beside Stable-Baselines3's.

Env steps per second (agent steps, 4 frames each) of collecting Breakout
with a Nature CNN choosing every action, one batched forward pass per
vector step, torch on one thread, at 16 and 64 envs in one process unless
said otherwise:

- fedrl actor: FrameActorCore.collect, the product's DQN actor on games
  (ale-py's native vector env, ε-greedy, n-step bookkeeping, frames out);
- ALE native + CNN: the same env and network without fedrl's bookkeeping;
- single envs + CNN: Gymnasium's AtariPreprocessing and FrameStackObservation
  around each env, stepped in a SyncVectorEnv: the alternative to the ALE's
  native vector env (fedrl.envs.atari);
- SB3 DummyVecEnv / SubprocVecEnv: make_atari_env (AtariWrapper: no-op
  reset, frame skip 4 with max-pooling, 84×84 greyscale, episodic life,
  clipped rewards) + VecFrameStack(4), actions from DQN("CnnPolicy").predict;
  SubprocVecEnv runs one process per env.

Every setting plays ALE/Breakout-v5's game (sticky actions 0.25; the
wrappers get it with frameskip 1 and skip themselves). Figures are medians
over repeats; the machine's load average is printed with them.

    .venv/bin/python bench/atari_collection.py [--quick]

Needs the bench extra (Stable-Baselines3, OpenCV). The last line of stdout
is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from fedrl.client.training.actor import make_actor_spec
from fedrl.client.training.frame_actor import FrameActorCore, FrameActorSpec
from fedrl.client.training.q_network import build_q_network
from fedrl.client.training.vector_env import make_vector_env

ENV_ID = "ALE/Breakout-v5"
WIDTHS = (16, 64)


def _rate(step: Callable[[], int], seconds: float, repeats: int) -> float:
    """Median env steps/s of `step` (which returns env steps done) over `repeats` timings."""
    step()  # warm-up
    rates = []
    for _ in range(repeats):
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            done += step()
        rates.append(done / elapsed)
    return statistics.median(rates)


def fedrl_actor(envs: int, seconds: float, repeats: int) -> float:
    spec = make_actor_spec(
        0,
        num_actors=1,
        generation=0,
        seed_root=np.random.SeedSequence(0),
        env_id=ENV_ID,
        num_envs=envs,
        exploration_base=0.4,
        exploration_alpha=7.0,
        n_step=3,
        gamma=0.99,
        hidden=(),
        dueling=True,
        steps_per_slot=8,
    )
    actor = FrameActorCore(FrameActorSpec(spec, clip_rewards=True, episodic_life=True))
    try:
        return _rate(lambda: actor.collect(8).env_steps, seconds, repeats)
    finally:
        actor.close()


def _cnn_stepper(env: gym.vector.VectorEnv, channels_last: bool) -> Callable[[], int]:
    shape = env.single_observation_space.shape
    assert shape is not None
    obs_shape = (shape[-1], *shape[:-1]) if channels_last else tuple(shape)
    net = build_q_network(obs_shape, int(env.single_action_space.n), dueling=True).eval()  # type: ignore[attr-defined]
    obs, _ = env.reset(seed=0)
    state = {"obs": obs}

    def step() -> int:
        batch = torch.from_numpy(np.asarray(state["obs"]))
        if channels_last:
            batch = batch.permute(0, 3, 1, 2)
        with torch.inference_mode():
            action = net(batch).argmax(dim=1).numpy()
        state["obs"], *_ = env.step(action)
        return env.num_envs

    return step


def ale_native(envs: int, seconds: float, repeats: int) -> float:
    env = make_vector_env(ENV_ID, envs)
    try:
        return _rate(_cnn_stepper(env, channels_last=False), seconds, repeats)
    finally:
        env.close()


def single_envs(envs: int, seconds: float, repeats: int) -> float:
    def make() -> gym.Env[Any, Any]:
        env = gym.make(ENV_ID, frameskip=1)
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
        return gym.wrappers.FrameStackObservation(env, 4, padding_type="zero")

    env = gym.vector.SyncVectorEnv([make for _ in range(envs)])
    try:
        return _rate(_cnn_stepper(env, channels_last=False), seconds, repeats)
    finally:
        env.close()


def _breakout(**kwargs: Any) -> gym.Env[Any, Any]:
    """The game for SB3's wrappers, made where ale-py is imported (its subprocesses too)."""
    import ale_py  # noqa: PLC0415

    gym.register_envs(ale_py)
    return gym.make(ENV_ID, **kwargs)


def sb3(envs: int, seconds: float, repeats: int, *, subprocess: bool) -> float:
    from stable_baselines3 import DQN  # noqa: PLC0415 (bench extra)
    from stable_baselines3.common.env_util import make_atari_env  # noqa: PLC0415
    from stable_baselines3.common.vec_env import (  # noqa: PLC0415
        DummyVecEnv,
        SubprocVecEnv,
        VecFrameStack,
    )

    vec = make_atari_env(
        _breakout,
        n_envs=envs,
        seed=0,
        env_kwargs={"frameskip": 1},
        vec_env_cls=SubprocVecEnv if subprocess else DummyVecEnv,
    )
    env = VecFrameStack(vec, n_stack=4)
    try:
        model = DQN("CnnPolicy", env, buffer_size=1, learning_starts=0, device="cpu")
        state = {"obs": env.reset()}

        def step() -> int:
            action, _ = model.predict(state["obs"], deterministic=True)
            state["obs"], *_ = env.step(action)
            return envs

        return _rate(step, seconds, repeats)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timings, 16 envs only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seconds, repeats = (2.0, 1) if args.quick else (6.0, 3)
    widths = WIDTHS[:1] if args.quick else WIDTHS
    settings: dict[str, Callable[[int], float]] = {
        "fedrl actor": lambda n: fedrl_actor(n, seconds, repeats),
        "ALE native + CNN": lambda n: ale_native(n, seconds, repeats),
        "single envs + CNN": lambda n: single_envs(n, seconds, repeats),
        "SB3 DummyVecEnv": lambda n: sb3(n, seconds, repeats, subprocess=False),
        "SB3 SubprocVecEnv": lambda n: sb3(n, seconds, repeats, subprocess=True),
    }
    load = os.getloadavg()[0]
    results: dict[str, dict[str, float]] = {}
    print(f"{ENV_ID}, env steps/s with Nature CNN inference (median of {repeats}), load {load:.1f}")
    print(f"{'':<20}" + "".join(f"{f'{n} envs':>12}" for n in widths))
    for name, run in settings.items():
        results[name] = {str(n): round(run(n), 1) for n in widths}
        print(f"{name:<20}" + "".join(f"{results[name][str(n)]:>12,.0f}" for n in widths))
    for n in widths:
        ours, dummy = results["fedrl actor"][str(n)], results["SB3 DummyVecEnv"][str(n)]
        sub = results["SB3 SubprocVecEnv"][str(n)]
        native, single = results["ALE native + CNN"][str(n)], results["single envs + CNN"][str(n)]
        print(
            f"{n} envs: fedrl {ours / dummy:.1f}x SB3 DummyVecEnv, {ours / sub:.1f}x "
            f"SubprocVecEnv; native vector env {native / single:.1f}x single envs"
        )
    print(
        json.dumps(
            {
                "env": ENV_ID,
                "env_steps_per_s": results,
                "load_average": round(load, 2),
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
