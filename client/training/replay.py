"""Experience replay: a preallocated ring buffer with proportional prioritized sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedrl.client.training.device_replay import DeviceReplay
from fedrl.client.training.transitions import LearnerTransitions


@dataclass(frozen=True)
class SampledBatch:
    """A training batch and what the learner needs to write priorities back."""

    batch: LearnerTransitions
    """The sampled transitions."""
    indices: np.ndarray
    """int64 [B]: buffer slots, to pass back to ``update_priorities``."""
    weights: np.ndarray
    """float32 [B]: importance-sampling weights, the largest is 1."""
    foreign: np.ndarray
    """bool [B]: True where the transition came from another participant."""


class Replay(Protocol):
    """What the learner needs of a replay: a PrioritizedReplay, or a mix of several."""

    def __len__(self) -> int: ...

    def add(self, batch: LearnerTransitions, *, foreign: bool = False) -> None: ...

    def sample(self, batch_size: int, beta: float) -> SampledBatch: ...

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None: ...

    def recent(self, count: int) -> LearnerTransitions:
        """The newest `count` transitions (all it holds, if fewer), oldest first."""
        ...

    @property
    def nbytes(self) -> int:
        """Memory the replay holds."""
        ...


class SumTree:
    """A binary tree whose every node holds the sum of its two children.

    Leaves hold priorities; drawing a uniform number in [0, total) and walking
    down picks leaf i with probability p_i / total in O(log n). Both walks move
    a whole batch down one level per handful of numpy operations, so a batch
    of 512 costs ~log2(capacity) vectorised steps rather than 512 Python loops.
    Node 1 is the root, node n's children are 2n and 2n + 1.
    """

    def __init__(self, capacity: int) -> None:
        self._depth = max(1, (capacity - 1).bit_length())
        self._leaves = 1 << self._depth
        # float64: sums of ~10^6 float32-sized priorities would lose the small ones.
        self._nodes = np.zeros(2 * self._leaves, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self._nodes[1])

    @property
    def nbytes(self) -> int:
        return int(self._nodes.nbytes)

    def get(self, slots: np.ndarray) -> np.ndarray:
        leaves: np.ndarray = self._nodes[slots + self._leaves]
        return leaves

    def set(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaves, then recompute their ancestors level by level."""
        tree = self._nodes
        nodes = slots + self._leaves
        # A slot given twice keeps one of its values; re-reading the level
        # below keeps every parent equal to the sum of what its children hold.
        tree[nodes] = priorities
        for _ in range(self._depth):
            sums = tree[nodes] + tree[nodes ^ 1]
            nodes >>= 1
            tree[nodes] = sums

    def find(self, targets: np.ndarray) -> np.ndarray:
        """The leaf slot whose cumulative-priority interval holds each target.

        Targets must lie in [0, total). Float rounding can carry a target
        from the end of one leaf's interval just into the next leaf, which is
        harmless between written leaves; a caller whose written leaves are a
        prefix clamps the result to that prefix.
        """
        tree = self._nodes
        targets = targets.copy()
        nodes = np.ones(targets.shape[0], dtype=np.int64)
        for _ in range(self._depth):
            nodes <<= 1
            left = tree[nodes]
            go_right = targets >= left
            targets -= left * go_right
            nodes += go_right
        slots: np.ndarray = nodes - self._leaves
        return slots


class ReplayStore:
    """What every replay keeps alike: its settings, sampling state and per-transition columns.

    One constructor for the plain and the frame replay, which are
    interchangeable (fedrl.client.training.frame_replay.make_replay builds
    either with the same arguments); each kind checks what it can hold
    (`_check`) and allocates what it stores its own way (`_allocate`). Either
    can keep a copy of its transitions on the learner's device (`mirror_on`).

    Not thread-safe: one owner adds, samples and updates.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        *,
        prioritized: bool = True,
        alpha: float = 0.6,
        eps: float = 1e-6,
        seed: int,
    ) -> None:
        self._check(capacity, tuple(obs_shape))
        check_priority_settings(alpha, eps)
        self._capacity = capacity
        self.obs_shape = tuple(obs_shape)
        self.prioritized = prioritized
        self._alpha = alpha
        self._eps = eps
        self._rng = np.random.default_rng(seed)
        self._action = np.zeros(capacity, dtype=np.int64)
        self._reward = np.zeros(capacity, dtype=np.float32)
        self._discount = np.zeros(capacity, dtype=np.float32)
        self._foreign = np.zeros(capacity, dtype=np.bool_)
        # In p^alpha space: what a new transition gets.
        self._max_priority = 1.0
        self._size = 0
        self.mirror: DeviceReplay | None = None
        """The copy on the learner's device that every write also reaches (mirror_on)."""
        self._allocate()

    def _check(self, capacity: int, obs_shape: tuple[int, ...]) -> None:
        """Raise ValueError where this kind of replay cannot hold `capacity` of `obs_shape`."""
        raise NotImplementedError

    def _allocate(self) -> None:
        """Allocate what this kind of replay stores beyond the shared columns."""
        raise NotImplementedError

    def __len__(self) -> int:
        """Transitions that can be drawn."""
        return self._size

    def mirror_on(self, device: torch.device) -> DeviceReplay:
        """Keep a copy of every transition on `device` (a DeviceReplay, whose priorities the
        device's update then owns), starting with those held now."""
        if self.mirror is None or self.mirror.device != device:
            stack, obs_dtype = self._mirror_layout()
            mirror = DeviceReplay(
                self._capacity,
                self.obs_shape,
                stack=stack,
                obs_dtype=obs_dtype,
                prioritized=self.prioritized,
                alpha=self._alpha,
                eps=self._eps,
                device=device,
            )
            self._copy_to(mirror)
            mirror.set_size(self._size)
            self.mirror = mirror
        return self.mirror

    def _mirror_layout(self) -> tuple[int | None, torch.dtype]:
        """How the device copy lays transitions out: the stack depth whose frames it keeps
        once (None: whole rows), and the observations' dtype."""
        raise NotImplementedError

    def _copy_to(self, mirror: DeviceReplay) -> None:
        """Write everything held now into a new mirror, priorities included."""
        raise NotImplementedError


class PrioritizedReplay(ReplayStore):
    """A fixed-capacity FIFO of transitions, sampled by priority or uniformly.

    Proportional prioritization (Schaul et al. 2016): slot i is drawn with
    probability p_i^alpha / sum_j p_j^alpha where p_i = |TD error| + eps, and
    corrected with importance weights (N * P(i))^-beta, divided by the batch's
    largest so they only ever scale updates down. New transitions get the
    highest priority seen so far, so each is replayed at least once soon.
    """

    def _check(self, capacity: int, obs_shape: tuple[int, ...]) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be at least 1, got {capacity}")

    def _allocate(self) -> None:
        self._obs = np.zeros((self._capacity, *self.obs_shape), dtype=np.float32)
        self._next_obs = np.zeros((self._capacity, *self.obs_shape), dtype=np.float32)
        self._tree = SumTree(self._capacity) if self.prioritized else None
        self._next = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Memory the replay holds, all of it allocated up front."""
        columns = (self._obs, self._next_obs, self._action, self._reward, self._discount)
        tree = self._tree.nbytes if self._tree is not None else 0
        return sum(c.nbytes for c in columns) + self._foreign.nbytes + tree

    def add(self, batch: LearnerTransitions, *, foreign: bool = False) -> None:
        """Append a batch, overwriting the oldest transitions once full."""
        batch.validate(self.obs_shape)
        count = len(batch)
        if count == 0:
            return
        # A batch larger than the buffer: only its newest `capacity` rows survive.
        skip = max(0, count - self._capacity)
        slots = (self._next + skip + np.arange(count - skip)) % self._capacity
        self._obs[slots] = batch.obs[skip:]
        self._next_obs[slots] = batch.next_obs[skip:]
        self._action[slots] = batch.action[skip:]
        self._reward[slots] = batch.reward[skip:]
        self._discount[slots] = batch.discount[skip:]
        self._foreign[slots] = foreign
        if self._tree is not None:
            self._tree.set(slots, np.full(slots.shape[0], self._max_priority))
        self._next = int((self._next + count) % self._capacity)
        self._size = min(self._capacity, self._size + count)
        if self.mirror is not None:
            self.mirror.write_rows(
                slots,
                batch.obs[skip:],
                batch.action[skip:],
                batch.reward[skip:],
                batch.next_obs[skip:],
                batch.discount[skip:],
            )
            self.mirror.set_size(self._size)

    def _mirror_layout(self) -> tuple[int | None, torch.dtype]:
        return None, torch.float32

    def _copy_to(self, mirror: DeviceReplay) -> None:
        slots = np.arange(self._size)
        if not slots.size:
            return
        columns = (self._obs, self._action, self._reward, self._next_obs, self._discount)
        mirror.write_rows(slots, *(column[slots] for column in columns))
        if self._tree is not None:
            mirror.set_priorities(slots, self._tree.get(slots), self._max_priority)

    def recent(self, count: int) -> LearnerTransitions:
        """The newest `count` transitions (all it holds, if fewer), oldest first: copies."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        count = min(count, self._size)
        slots = (self._next - count + np.arange(count)) % self._capacity
        return LearnerTransitions(
            obs=self._obs[slots],
            action=self._action[slots],
            reward=self._reward[slots],
            next_obs=self._next_obs[slots],
            discount=self._discount[slots],
        )

    def sample(self, batch_size: int, beta: float) -> SampledBatch:
        """Draw batch_size transitions (with replacement) and their weights."""
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if self._tree is None:
            slots = self._rng.integers(0, self._size, size=batch_size)
            weights = np.ones(batch_size, dtype=np.float32)
        else:
            slots, weights = self._sample_prioritized(self._tree, batch_size, beta)
        return SampledBatch(
            batch=LearnerTransitions(
                obs=self._obs[slots],
                action=self._action[slots],
                reward=self._reward[slots],
                next_obs=self._next_obs[slots],
                discount=self._discount[slots],
            ),
            indices=slots.astype(np.int64, copy=False),
            weights=weights,
            foreign=self._foreign[slots],
        )

    def _sample_prioritized(
        self, tree: SumTree, batch_size: int, beta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        # Stratified: one draw in each of batch_size equal slices of the total
        # mass, which lowers the variance of the batch against independent draws.
        total = tree.total
        targets = (np.arange(batch_size) + self._rng.random(batch_size)) * (total / batch_size)
        # Slots fill from 0 and never empty, so unwritten (zero) leaves are all
        # at or past size: clamping undoes a rounding step over that edge.
        slots = np.minimum(tree.find(targets), self._size - 1)
        probabilities = tree.get(slots) / total
        weights = (self._size * probabilities) ** (-beta)
        return slots, (weights / weights.max()).astype(np.float32)

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        """Set the priorities of sampled slots from their new |TD errors|.

        A no-op for uniform replay, so the learner need not care which it has.
        """
        indices, td_abs = checked_priority_update(indices, td_abs, bound=self._size)
        if self._tree is None or indices.size == 0:
            return
        priorities = (np.abs(td_abs) + self._eps) ** self._alpha
        self._tree.set(indices.astype(np.int64, copy=False), priorities)
        self._max_priority = max(self._max_priority, float(priorities.max()))


def check_priority_settings(alpha: float, eps: float) -> None:
    """Refuses PER settings under which sampling breaks: a negative exponent inverts the
    priorities, and eps = 0 gives a transition with zero TD error no chance to be drawn again."""
    if alpha < 0.0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if eps <= 0.0:
        raise ValueError(f"eps must be > 0 so no transition becomes unreachable, got {eps}")


def checked_priority_update(
    indices: np.ndarray, td_abs: np.ndarray, *, bound: int
) -> tuple[np.ndarray, np.ndarray]:
    """`indices` and `td_abs` as arrays, refused unless they pair up, the indices lie in
    [0, bound) and every error is finite: the learner's numbers would otherwise corrupt the
    sum tree, where a bad priority skews every later draw."""
    indices = np.asarray(indices)
    td_abs = np.asarray(td_abs, dtype=np.float64)
    if indices.shape != td_abs.shape or indices.ndim != 1:
        raise ValueError(
            f"indices {indices.shape} and td_abs {td_abs.shape} must be equal 1-D shapes"
        )
    if indices.size and (indices.min() < 0 or indices.max() >= bound):
        raise ValueError(f"priority indices must lie in [0, {bound})")
    if not np.all(np.isfinite(td_abs)):
        raise ValueError("td_abs holds a NaN or infinite value")
    return indices, td_abs
