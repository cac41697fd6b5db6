"""What a run's buffers take in memory, known before they are allocated.

Start-up reports it, `fedrl-client check` recommends a replay capacity from
it, and the default replay of a game is sized by it. Frame stacks are kept
once per frame (fedrl.client.training.frame_replay): for Atari 7.1 KB per
transition where a store of whole uint8 stacks would take 56.5 KB and one
of float32 stacks 226 KB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import psutil

from fedrl.client.training.cnn import is_image
from fedrl.client.training.frame_replay import FrameReplay

MOST_TRANSITIONS = 1_000_000
"""The largest default replay: the 1M transitions of Mnih et al. (2015)."""
RAM_SHARE = 0.5
"""The share of the memory available at start that a default replay may take."""


def replay_bytes(capacity: int, obs_shape: tuple[int, ...], *, streams: int = 0) -> int:
    """Bytes of the replay a learner builds for `capacity` and observations of `obs_shape`."""
    if is_image(obs_shape):
        return FrameReplay.bytes_for(capacity, obs_shape, streams)
    return stacked_bytes(capacity, obs_shape, itemsize=4)


def stacked_bytes(capacity: int, obs_shape: tuple[int, ...], *, itemsize: int) -> int:
    """Bytes of a plain replay (fedrl.client.training.replay.PrioritizedReplay) holding
    `capacity` transitions of two whole observations each, `itemsize` bytes per value."""
    rows = capacity * (2 * math.prod(obs_shape) * itemsize + 8 + 4 + 4 + 1)
    return rows + 2 * (1 << max(1, (capacity - 1).bit_length())) * 8


def available_bytes() -> int:
    """Memory the system could give this process now without swapping."""
    return int(psutil.virtual_memory().available)


def fitting_capacity(
    obs_shape: tuple[int, ...],
    *,
    available: int | None = None,
    share: float = RAM_SHARE,
    most: int = MOST_TRANSITIONS,
) -> int:
    """The most transitions (frames, for images) up to `most` whose replay takes at most
    `share` of the available memory; a multiple of 1,000 where that leaves any."""
    budget = share * (available_bytes() if available is None else available)
    low, high = 1, most  # replay_bytes grows with the capacity: search for the largest
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (
            (middle, high) if replay_bytes(middle, obs_shape) <= budget else (low, middle - 1)
        )
    return low - low % 1_000 if low >= 1_000 else low


@dataclass(frozen=True)
class MemoryUse:
    """A run's large buffers, in bytes."""

    replay: int
    replay_capacity: int
    stacked_replay: int
    """What a replay of whole uint8 observations of the same capacity would take."""
    slots: int
    """The shared-memory slots between actors and learner (0 in one process)."""
    available: int

    def describe(self) -> str:
        def gb(n: int) -> str:
            return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"

        saved = (
            f" (whole uint8 stacks would take {gb(self.stacked_replay)})"
            if self.stacked_replay > self.replay
            else ""
        )
        slots = f", shared-memory slots {gb(self.slots)}" if self.slots else ""
        return (
            f"memory: replay {gb(self.replay)} for {self.replay_capacity:,} "
            f"{'frames' if saved else 'transitions'}{saved}{slots}; "
            f"{gb(self.available)} available"
        )


def memory_use(replay: int, capacity: int, obs_shape: tuple[int, ...], slots: int) -> MemoryUse:
    """The accounting of a run whose replay takes `replay` bytes for `capacity` entries."""
    image = is_image(obs_shape)
    stacked = stacked_bytes(capacity, obs_shape, itemsize=1) if image else replay
    return MemoryUse(
        replay=replay,
        replay_capacity=capacity,
        stacked_replay=stacked,
        slots=slots,
        available=available_bytes(),
    )
