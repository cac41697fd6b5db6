"""Frame stacks over time as single frames and back: how PPO's rollout slots hold Atari's.

A rollout records each env's observation at every step; for a game these
are stacks of k frames (fedrl.envs.atari) and each shares k − 1 of them
with the step before. A rollout slot (fedrl.client.training.shm) therefore
holds the first step's stacks whole, then one frame per env and step and
whether that step's stack starts a game (the rest of it zeros, as the env
pads a game's first stack). `split_stacks` refuses anything that is not
such a sequence, so `join_stacks` always gives back exactly what was split.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Frames = npt.NDArray[np.uint8]


def split_stacks(obs: Frames) -> tuple[Frames, Frames, npt.NDArray[np.bool_]]:
    """[T, E, k, H, W] stacks as (newest frames [T, E, H, W], first stacks [E, k, H, W],
    starts [T, E]); ValueError if a stack neither continues the one before nor starts a game."""
    steps, envs = obs.shape[:2]
    continues = np.zeros((steps, envs), dtype=np.bool_)
    for t in range(1, steps):
        continues[t] = (obs[t, :, :-1] == obs[t - 1, :, 1:]).reshape(envs, -1).all(axis=1)
    starts = ~continues
    starts[0] = False  # the first stacks travel whole
    if obs[starts][:, :-1].any():
        raise ValueError(
            "these observations are not frame stacks: a stack neither continues the one "
            "before nor starts a game with zeros"
        )
    return obs[:, :, -1], obs[0], starts


def join_stacks(frames: Frames, first: Frames, starts: npt.NDArray[np.bool_]) -> Frames:
    """The stacks `split_stacks` took apart."""
    steps = starts.shape[0]
    obs = np.empty((steps, *first.shape), dtype=np.uint8)
    obs[0] = first
    for t in range(1, steps):
        obs[t, :, :-1] = obs[t - 1, :, 1:]
        obs[t, starts[t], :-1] = 0
        obs[t, :, -1] = frames[t]
    return obs
