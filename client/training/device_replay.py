"""A replay's transitions mirrored on the learner's device, for an update that never leaves it.

The host replay (fedrl.client.training.replay.PrioritizedReplay, or the
frame replay of fedrl.client.training.frame_replay) keeps deciding where
each transition goes, which ones die and what experience exchange reads
back; whatever it writes it also writes here, in batches, through pinned
host buffers and non-blocking copies. What the update reads lives here
only: the columns, the priorities (fedrl.client.training.device_priorities)
and the replay's size, all tensors on the device.

Two layouts, as on the host: plain rows (obs and next_obs per transition),
or frames kept once (uint8 [capacity + 1, H, W], the last an all-zero pad)
with each transition's two stacks as k frame entries each, so a batch's
stacks are one gather. The host replay only keeps a transition while every
frame of its stacks is still held, so the entries written with it stay
right for as long as it can be drawn.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from fedrl.client.training.device_priorities import DevicePriorities


class DeviceBatch(NamedTuple):
    """One update's batch, as tensors on the learner's device."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    discount: torch.Tensor
    weights: torch.Tensor


class DeviceReplay:
    """Columns, priorities and size of a replay of `capacity` slots, on `device`.

    `stack` None holds plain rows of `obs_shape`; a stack depth k holds
    frames of `obs_shape[1:]` and k entries per stack.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        *,
        stack: int | None,
        obs_dtype: torch.dtype,
        prioritized: bool,
        alpha: float,
        eps: float,
        device: torch.device,
    ) -> None:
        self.device = device
        self.prioritized = prioritized
        self._cuda = device.type == "cuda"
        self._stack = stack
        self._obs: torch.Tensor | None
        self._next_obs: torch.Tensor | None
        self._frames: torch.Tensor | None
        self._obs_entries: torch.Tensor | None
        self._next_entries: torch.Tensor | None
        if stack is None:
            self._obs = torch.zeros((capacity, *obs_shape), dtype=obs_dtype, device=device)
            self._next_obs = torch.zeros_like(self._obs)
            self._frames = self._obs_entries = self._next_entries = None
        else:
            self._obs = self._next_obs = None
            self._frames = torch.zeros(
                (capacity + 1, *obs_shape[1:]), dtype=torch.uint8, device=device
            )
            self._obs_entries = torch.zeros((capacity, stack), dtype=torch.int64, device=device)
            self._next_entries = torch.zeros_like(self._obs_entries)
        self._action = torch.zeros(capacity, dtype=torch.int64, device=device)
        self._reward = torch.zeros(capacity, dtype=torch.float32, device=device)
        self._discount = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.priorities = DevicePriorities(capacity, alpha=alpha, eps=eps, device=device)
        self.size = torch.zeros((), dtype=torch.float64, device=device)
        """Transitions that can be drawn, as the host replay counts them."""

    @property
    def nbytes(self) -> int:
        """Device memory the mirror holds, all of it allocated up front."""
        tensors = [
            t
            for t in (
                self._obs,
                self._next_obs,
                self._frames,
                self._obs_entries,
                self._next_entries,
                self._action,
                self._reward,
                self._discount,
            )
            if t is not None
        ]
        return sum(t.nbytes for t in tensors) + self.priorities.nbytes

    @staticmethod
    def bytes_for(capacity: int, obs_shape: tuple[int, ...], *, stack: int | None) -> int:
        """What `nbytes` will be for `capacity` slots of `obs_shape` (float32 rows, or uint8
        frames of stacks `stack` deep)."""
        if stack is None:
            observations = 2 * capacity * math.prod(obs_shape) * 4
        else:
            observations = (capacity + 1) * math.prod(obs_shape[1:]) + 2 * capacity * stack * 8
        # action (int64), reward and discount (float32); priorities and last writers (8 each)
        return observations + capacity * (8 + 4 + 4 + 8 + 8) + 8

    # -- written by the host replay ------------------------------------------------

    def upload(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the device: through pinned memory, not waited for, on CUDA.

        torch's caching host allocator keeps the pinned copy alive until the
        transfer is done, so the caller may reuse its array at once.
        """
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if not self._cuda:
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def write_rows(  # noqa: PLR0917 (the columns of LearnerTransitions, in their order)
        self,
        slots: np.ndarray,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        discount: np.ndarray,
    ) -> None:
        """Plain rows into `slots`, each at the largest priority so far."""
        if self._obs is None or self._next_obs is None:
            raise TypeError("this device replay keeps frames: write frames and stack entries")
        at = self.upload(np.asarray(slots, dtype=np.int64))
        self._obs.index_copy_(0, at, self.upload(obs).to(self._obs.dtype))
        self._next_obs.index_copy_(0, at, self.upload(next_obs).to(self._obs.dtype))
        self._write_columns(at, action, reward, discount)

    def write_frames(self, entries: np.ndarray, frames: np.ndarray) -> None:
        """uint8 frames [N, H, W] into ring `entries` [N]."""
        if self._frames is None:
            raise TypeError("this device replay keeps plain rows, not frames")
        at = self.upload(np.asarray(entries, dtype=np.int64))
        self._frames.index_copy_(0, at, self.upload(frames))

    def write_stacked(  # noqa: PLR0917 (the columns of LearnerTransitions, in their order)
        self,
        slots: np.ndarray,
        obs_entries: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_entries: np.ndarray,
        discount: np.ndarray,
    ) -> None:
        """Transitions into `slots`, their stacks as k frame entries each ([N, k], oldest first)."""
        if self._obs_entries is None or self._next_entries is None:
            raise TypeError("this device replay keeps plain rows, not frames")
        at = self.upload(np.asarray(slots, dtype=np.int64))
        self._obs_entries.index_copy_(0, at, self.upload(np.asarray(obs_entries, np.int64)))
        self._next_entries.index_copy_(0, at, self.upload(np.asarray(next_entries, np.int64)))
        self._write_columns(at, action, reward, discount)

    def _write_columns(
        self, at: torch.Tensor, action: np.ndarray, reward: np.ndarray, discount: np.ndarray
    ) -> None:
        self._action.index_copy_(0, at, self.upload(np.asarray(action, dtype=np.int64)))
        self._reward.index_copy_(0, at, self.upload(np.asarray(reward, dtype=np.float32)))
        self._discount.index_copy_(0, at, self.upload(np.asarray(discount, dtype=np.float32)))
        self.priorities.insert(at)

    def set_priorities(self, slots: np.ndarray, values: np.ndarray, max_priority: float) -> None:
        """Priorities (p^alpha) the host replay holds for `slots`, and its largest so far."""
        self.priorities.values.index_copy_(
            0, self.upload(np.asarray(slots, dtype=np.int64)), self.upload(values)
        )
        self.priorities.max_priority.fill_(max_priority)

    def remove(self, slots: np.ndarray) -> None:
        """Transitions that died on the host: never drawn again."""
        self.priorities.remove(self.upload(np.asarray(slots, dtype=np.int64)))

    def set_size(self, size: int) -> None:
        self.size.fill_(size)

    # -- read by the update ------------------------------------------------------------

    def draw(
        self, batch_size: int, *, beta: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots drawn by priority (uniformly over the live ones when not prioritized) and
        their importance weights (all 1 when not prioritized)."""
        slots, weights = self.priorities.draw(
            batch_size, beta=beta, size=self.size, generator=generator
        )
        if not self.prioritized:
            weights = torch.ones_like(weights)
        return slots, weights

    def gather(self, slots: torch.Tensor, weights: torch.Tensor) -> DeviceBatch:
        """The transitions in `slots` with their `weights`, stacks rebuilt from their frames."""
        if self._frames is not None:
            assert self._obs_entries is not None and self._next_entries is not None
            obs = self._frames[self._obs_entries[slots]]
            next_obs = self._frames[self._next_entries[slots]]
        else:
            assert self._obs is not None and self._next_obs is not None
            obs, next_obs = self._obs[slots], self._next_obs[slots]
        return DeviceBatch(
            obs=obs,
            action=self._action[slots],
            reward=self._reward[slots],
            next_obs=next_obs,
            discount=self._discount[slots],
            weights=weights,
        )

    def write_back(self, slots: torch.Tensor, td_abs: torch.Tensor) -> None:
        """New priorities of drawn slots from their |TD errors|; nothing when not prioritized."""
        if self.prioritized:
            self.priorities.write_back(slots, td_abs)
