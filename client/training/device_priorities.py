"""Proportional priorities as one tensor on the learner's device, drawn from with fixed shapes.

The device-side counterpart of fedrl.client.training.replay.SumTree: the
same distribution (slot i with probability p_i / sum_j p_j, one stratified
draw per equal slice of the total mass) and the same importance weights,
computed by a handful of tensor operations whose shapes never change, so a
CUDA graph can hold them: one float64 prefix sum over the slots and a
binary search per draw (`torch.searchsorted`), where a tree walk would cost
two kernels per level. A million slots are 8 MB, one scan of a few
microseconds on a current GPU. No boolean-mask indexing, no `.item()`: the
largest priority and the replay's size are device tensors too.

Every function here also runs on CPU tensors, eagerly; the tests check the
distribution and the written values there against the sum tree's.
"""

from __future__ import annotations

import torch


class DevicePriorities:
    """p_i^alpha of every slot of a replay (0 for an empty or dead slot), on one device."""

    def __init__(self, capacity: int, *, alpha: float, eps: float, device: torch.device) -> None:
        self.capacity = capacity
        self.alpha = alpha
        self.eps = eps
        # float64 as the host tree: a sum over a million float32-sized priorities
        # would lose the small ones.
        self.values = torch.zeros(capacity, dtype=torch.float64, device=device)
        self.max_priority = torch.ones((), dtype=torch.float64, device=device)
        """In p^alpha space: what a new transition gets."""
        # For each slot, the last batch position that wrote it (write_back's duplicates).
        self._last_writer = torch.full((capacity,), -1, dtype=torch.int64, device=device)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self._last_writer.nbytes + self.max_priority.nbytes

    def insert(self, slots: torch.Tensor) -> None:
        """New transitions in `slots` get the largest priority seen so far."""
        self.values.index_put_((slots,), self.max_priority)

    def remove(self, slots: torch.Tensor) -> None:
        """Slots whose transitions died: never drawn again until written anew."""
        self.values.index_fill_(0, slots, 0.0)

    def draw(
        self,
        batch_size: int,
        *,
        beta: torch.Tensor,
        size: torch.Tensor,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`batch_size` stratified draws: int64 slots and float32 importance weights.

        Weights are (size · P(i))^-beta over the batch's largest, as the host
        replay's (Schaul et al. 2016). The search is `right=True` on the
        prefix sums, so it returns the first slot whose sum exceeds the
        target: a zero-priority slot never has, whatever the rounding, once
        targets are kept below the total.
        """
        values = self.values
        cumulative = torch.cumsum(values, 0)
        total = cumulative[-1]
        offsets = torch.rand(
            batch_size, dtype=torch.float64, device=values.device, generator=generator
        )
        strata = torch.arange(batch_size, dtype=torch.float64, device=values.device)
        targets = (strata + offsets) * (total / batch_size)
        targets = torch.minimum(targets, torch.nextafter(total, torch.zeros_like(total)))
        slots = torch.searchsorted(cumulative, targets, right=True).clamp_(max=self.capacity - 1)
        probabilities = values[slots] / total
        weights = (size * probabilities).pow(-beta)
        return slots, (weights / weights.max()).float()

    def write_back(self, slots: torch.Tensor, td_abs: torch.Tensor) -> None:
        """Set drawn slots' priorities from their new |TD errors| (the host's update_priorities).

        A slot drawn twice in one batch keeps the value of its last draw, as
        numpy's fancy assignment in the host tree does; on CUDA, where
        duplicate writes land in no set order, every duplicate writes that
        same value.
        """
        priorities = (td_abs.double().abs() + self.eps).pow(self.alpha)
        positions = torch.arange(slots.shape[0], device=slots.device)
        self._last_writer.index_fill_(0, slots, -1)
        self._last_writer.scatter_reduce_(0, slots, positions, reduce="amax")
        self.values.index_put_((slots,), priorities[self._last_writer[slots]])
        torch.maximum(self.max_priority, priorities.max(), out=self.max_priority)
