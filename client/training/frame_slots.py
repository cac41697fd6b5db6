"""Shared-memory slots for frame actors: a FrameSegment per slot, each frame in it once.

The frame counterpart of fedrl.client.training.shm's TransitionSlot, in the
same ring (shm.SlotRing) and exchanged the same way (only slot numbers cross
the pipes). A slot holds `steps` vector steps of `envs` envs: one uint8
frame per env and step, not the two stacks of four per transition a
TransitionSlot would hold (for Atari 7 KB per env step against 56 KB, uint8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedrl.client.training.frame_segment import FrameSegment
from fedrl.client.training.shm import (
    FieldSpec,
    RingLayout,
    RolloutLayout,
    SlotFill,
    _fields_bytes,
    _views,
)

_ROW_COLUMNS = ("env", "obs_step", "next_step", "action", "reward", "discount")


@dataclass(frozen=True)
class FrameLayout:
    """Geometry of the frame ring; actors rebuild the same views from it."""

    num_slots: int
    steps: int
    envs: int
    frame_shape: tuple[int, ...]
    n_step: int

    @property
    def rows_per_slot(self) -> int:
        # Each step completes at most one transition per env, an episode's end flushes
        # up to n − 1 more, and up to n per env wait from the previous slot.
        return self.envs * (self.steps + 2 * self.n_step)

    @property
    def episodes_per_slot(self) -> int:
        # A game spans at least two vector steps (its last one and the reset step).
        return self.envs * (self.steps // 2 + 1)

    def _fields(self) -> list[FieldSpec]:
        t, e, r, g = self.steps, self.envs, self.rows_per_slot, self.episodes_per_slot
        return [
            ("frames", (t, e, *self.frame_shape), np.dtype(np.uint8)),
            ("first", (t, e), np.dtype(np.bool_)),
            ("env", (r,), np.dtype(np.int64)),
            ("obs_step", (r,), np.dtype(np.int64)),
            ("next_step", (r,), np.dtype(np.int64)),
            ("action", (r,), np.dtype(np.int64)),
            ("reward", (r,), np.dtype(np.float32)),
            ("discount", (r,), np.dtype(np.float32)),
            ("episode_return", (g,), np.dtype(np.float64)),
            ("episode_length", (g,), np.dtype(np.int64)),
        ]

    @property
    def slot_bytes(self) -> int:
        return _fields_bytes(self._fields())

    def make_slot(self, buf: memoryview, offset: int) -> FrameSlot:
        return FrameSlot(buf, offset, self)


SlotLayout = RingLayout | RolloutLayout | FrameLayout
"""Any geometry a SlotRing is built on: transitions (DQN), rollouts (PPO) or frames (Atari DQN)."""


class FrameSlot:
    """Numpy views of one frame slot."""

    def __init__(self, buf: memoryview, offset: int, layout: FrameLayout) -> None:
        self.arrays = _views(buf, offset, layout._fields())
        self.rows_capacity = layout.rows_per_slot
        self.episodes_capacity = layout.episodes_per_slot

    def write(
        self,
        segment: FrameSegment,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
    ) -> None:
        rows, episodes = len(segment), len(episode_returns)
        if rows > self.rows_capacity or episodes > self.episodes_capacity:
            raise ValueError(
                f"slot holds {self.rows_capacity} rows and {self.episodes_capacity} episodes, "
                f"got {rows} and {episodes}"
            )
        a = self.arrays
        if a["frames"].shape != segment.frames.shape:
            raise ValueError(f"segment frames {segment.frames.shape}, slot {a['frames'].shape}")
        a["frames"][...] = segment.frames
        a["first"][...] = segment.first
        for name in _ROW_COLUMNS:
            a[name][:rows] = getattr(segment, name)
        a["episode_return"][:episodes] = episode_returns
        a["episode_length"][:episodes] = episode_lengths

    def read(
        self, fill: SlotFill
    ) -> tuple[FrameSegment, npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """Copies out, so the slot can go back to its actor at once."""
        if not (
            0 <= fill.rows <= self.rows_capacity and 0 <= fill.episodes <= self.episodes_capacity
        ):
            raise ValueError(f"slot fill {fill} exceeds the slot's capacity")
        a, n = self.arrays, fill.rows
        segment = FrameSegment(
            frames=a["frames"].copy(),
            first=a["first"].copy(),
            **{name: a[name][:n].copy() for name in _ROW_COLUMNS},
        )
        returns = np.asarray(a["episode_return"][: fill.episodes], dtype=np.float64).copy()
        lengths = np.asarray(a["episode_length"][: fill.episodes], dtype=np.int64).copy()
        return segment, returns, lengths
