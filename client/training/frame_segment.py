"""What a frame actor collects: single frames per step, and n-step transitions that point at them.

A game's observation is a stack of its last k frames, and consecutive
stacks of one env share k − 1 of them. So instead of stacks, an actor
hands over the newest frame of each observation it acted on, once, and its
n-step transitions as references to those frames: which env, and at which
step its observation and its bootstrap observation were. The frame replay
(fedrl.client.training.frame_replay) stores each frame once and rebuilds
the stacks when it samples.

Steps are counted from the segment's first step: a transition may start in
an earlier segment of the same env (a negative `obs_step`), but its
`next_step` always lies within this segment, so every frame a new
transition needs has arrived by the time the transition does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FrameSegment:
    """T vector steps of E envs as frames, and the R transitions completed with them."""

    frames: np.ndarray
    """uint8 [T, E, H, W]: the newest frame of the observation each env acted on at each step."""
    first: np.ndarray
    """bool [T, E]: that observation starts a stack (what came before it is zeros)."""
    env: np.ndarray
    """int64 [R]: the env of each transition."""
    obs_step: np.ndarray
    """int64 [R]: the step whose observation the action was taken in (may be < 0)."""
    next_step: np.ndarray
    """int64 [R]: the step whose observation the transition bootstraps from (0 <= it < T)."""
    action: np.ndarray
    """int64 [R]."""
    reward: np.ndarray
    """float32 [R]: the discounted sum of the k <= n (clipped) rewards."""
    discount: np.ndarray
    """float32 [R]: gamma**k, or 0 where the return was cut (the episode or a life ended)."""

    @property
    def steps(self) -> int:
        return int(self.first.shape[0])

    @property
    def envs(self) -> int:
        return int(self.first.shape[1])

    def __len__(self) -> int:
        """Transitions in the segment."""
        return int(self.env.shape[0])

    def validate(self, frame_shape: tuple[int, ...]) -> None:
        """Raise ValueError naming the first column whose dtype, shape or values are wrong."""
        t, e, rows = self.steps, self.envs, len(self)
        expected: tuple[tuple[str, np.dtype[np.generic], tuple[int, ...]], ...] = (
            ("frames", np.dtype(np.uint8), (t, e, *frame_shape)),
            ("first", np.dtype(np.bool_), (t, e)),
            ("env", np.dtype(np.int64), (rows,)),
            ("obs_step", np.dtype(np.int64), (rows,)),
            ("next_step", np.dtype(np.int64), (rows,)),
            ("action", np.dtype(np.int64), (rows,)),
            ("reward", np.dtype(np.float32), (rows,)),
            ("discount", np.dtype(np.float32), (rows,)),
        )
        for name, dtype, shape in expected:
            column = getattr(self, name)
            if not isinstance(column, np.ndarray) or column.dtype != dtype:
                raise ValueError(f"FrameSegment.{name} must be a {dtype} array")
            if column.shape != shape:
                raise ValueError(f"FrameSegment.{name} has shape {column.shape}, expected {shape}")
        if not rows:
            return
        if self.env.min() < 0 or self.env.max() >= e:
            raise ValueError(f"FrameSegment.env must lie in [0, {e})")
        if self.next_step.min() < 0 or self.next_step.max() >= t:
            raise ValueError(f"FrameSegment.next_step must lie in [0, {t})")
        if np.any(self.obs_step >= self.next_step):
            raise ValueError("FrameSegment.obs_step must come before next_step")
        if self.action.min() < 0:
            raise ValueError("FrameSegment.action holds a negative action")
        if not np.all(np.isfinite(self.reward)):
            raise ValueError("FrameSegment.reward holds a NaN or infinite value")
        if not (np.all(self.discount >= 0.0) and np.all(self.discount <= 1.0)):
            raise ValueError("FrameSegment.discount must lie in [0, 1]")
