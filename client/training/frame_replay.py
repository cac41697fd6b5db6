"""A replay for stacked frames that keeps each frame once and rebuilds stacks when it samples.

An Atari observation is uint8 [4, 84, 84], and a transition carries two of
them: 56 KB in a naive store, where consecutive stacks of one env share
three frames and a transition's next observation is a later one's
observation. Here every frame is one entry of a ring (7 KB), linked to the
previous frame of its stack chain; a transition lives in the entry of its
observation's newest frame and points at the entry of its bootstrap
observation. Sampling walks each chain back k − 1 links and gathers the
frames; where a chain starts (an env's reset), the rest of the stack is
zeros, as the env itself pads it (fedrl.envs.atari).

Two ways in, one store:
- `add_frames`: actors' segments (fedrl.client.training.frame_segment), one
  frame per env and step, chained per stream (an actor's env);
- `add`: whole transitions with their stacks (other participants'
  experience), deduplicated exactly: a row whose stack is the previous
  row's shifted by one frame adds one frame, a bootstrap stack that is a
  later row's observation adds none. Nothing is hashed: every shared frame
  is found by comparing bytes, so the stacks rebuilt are exactly the stacks
  given, whatever the rows (a row that shares nothing costs its own frames).

The ring is FIFO. An entry's transition dies when the entry is
overwritten, and so does one whose stack reaches back into an overwritten
entry: `oldest` keeps the serial number of the oldest frame each needs, and
after every write the few entries that may reach that far back (the span
of the deepest stack stored so far) are checked. Sampling is
proportional prioritized (Schaul et al. 2016) or uniform over the live
transitions, as in fedrl.client.training.replay.PrioritizedReplay, whose
interface this class shares so the learner and the experience exchange
need not know which one they have.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

from fedrl.client.training.cnn import is_image
from fedrl.client.training.device_replay import DeviceReplay
from fedrl.client.training.frame_segment import FrameSegment
from fedrl.client.training.replay import (
    PrioritizedReplay,
    ReplayStore,
    SampledBatch,
    SumTree,
    checked_priority_update,
)
from fedrl.client.training.transitions import LearnerTransitions

MATCH_AHEAD = 8
"""Rows ahead in which `add` looks for a row's bootstrap stack among later observations."""
HISTORY = 256
"""Steps per stream whose entries stay addressable by step: a transition's n must be below it."""
_REDRAWS = 8


class FrameReplay(ReplayStore):
    """`capacity` frames of stacks of shape `obs_shape` (k, H, W), and the transitions over them."""

    def _check(self, capacity: int, obs_shape: tuple[int, ...]) -> None:
        if len(obs_shape) != 3:
            raise ValueError(f"a frame replay holds stacks [k, H, W], got shape {obs_shape}")
        if capacity < obs_shape[0] + 1:
            raise ValueError(f"replay capacity must be at least {obs_shape[0] + 1} frames")

    def _allocate(self) -> None:
        capacity = self._capacity
        self._stack = self.obs_shape[0]
        pad = capacity  # the entry past the ring: an all-zero frame that starts every chain
        self._pad = pad
        self._frames = np.zeros((capacity + 1, *self.obs_shape[1:]), dtype=np.uint8)
        self._first = np.zeros(capacity + 1, dtype=np.bool_)
        self._first[pad] = True
        # Frames are numbered in the order written (serials); entry serial % capacity holds
        # frame `serial` until it is overwritten. Links name serials, so a link to an
        # overwritten frame shows. The pad's serial is above every other.
        self._serial = np.full(capacity + 1, np.iinfo(np.int64).max, dtype=np.int64)
        self._prev = np.full(capacity + 1, -1, dtype=np.int64)
        self._oldest = np.zeros(capacity, dtype=np.int64)
        self._next = np.zeros(capacity, dtype=np.int64)
        self._live = np.zeros(capacity, dtype=np.bool_)
        self._tree = SumTree(capacity)
        self._written = 0
        self._span = 0  # the most entries a stored transition's frames reach back
        # Per stream: the serials of its last HISTORY steps' frames, by step modulo HISTORY.
        self._streams = np.full((0, HISTORY), -1, dtype=np.int64)
        self._stream_steps = np.zeros(0, dtype=np.int64)

    @property
    def capacity(self) -> int:
        """Frames the ring holds; a transition takes about one."""
        return self._capacity

    @property
    def frames_written(self) -> int:
        """Frames stored since the replay was made (the ring holds the last `capacity`)."""
        return self._written

    @property
    def nbytes(self) -> int:
        """Memory the replay holds, all of it allocated up front (and the streams' history)."""
        arrays = [
            self._frames,
            self._first,
            self._prev,
            self._serial,
            self._oldest,
            self._next,
            self._action,
            self._reward,
            self._discount,
            self._foreign,
            self._live,
            self._streams,
            self._stream_steps,
        ]
        return sum(a.nbytes for a in arrays) + self._tree.nbytes

    @staticmethod
    def bytes_for(capacity: int, obs_shape: tuple[int, ...], streams: int = 0) -> int:
        """What `nbytes` will be for `capacity` frames of `obs_shape` and `streams` streams."""
        frame = int(np.prod(obs_shape[1:]))
        # frames and first (with the pad); prev and serial (with the pad); oldest, next and
        # action (int64); reward and discount (float32); foreign and live (bool).
        entries = (capacity + 1) * (frame + 1 + 16) + capacity * (3 * 8 + 2 * 4 + 2)
        tree = 2 * (1 << max(1, (capacity - 1).bit_length())) * 8
        return entries + tree + streams * (HISTORY + 1) * 8

    # -- adding --------------------------------------------------------------

    def add_frames(self, streams: np.ndarray, segment: FrameSegment) -> np.ndarray:
        """Store an actor's segment; `streams` [E] names the stream of each of its envs.

        Returns the entries of the transitions stored, ordered by stream and
        step (so consecutive ones share frames: see `transitions`).
        """
        segment.validate(self.obs_shape[1:])
        steps, envs = segment.steps, segment.envs
        streams = np.asarray(streams, dtype=np.int64)
        if streams.shape != (envs,) or (envs and streams.min() < 0):
            raise ValueError(f"need {envs} non-negative stream ids, got {streams}")
        if steps < 1 or steps * envs > self._capacity or steps > HISTORY:
            raise ValueError(
                f"a segment of {steps} steps of {envs} envs does not fit the replay "
                f"({self._capacity} frames, {HISTORY} steps of history)"
            )
        self._grow_streams(int(streams.max()) + 1 if envs else 0)
        serials = self._written + np.arange(steps * envs).reshape(steps, envs)
        slots = self._claim(steps * envs).reshape(steps, envs)
        counts = self._stream_steps[streams]
        # Each frame links to its env's frame one step earlier; the first one to the
        # stream's last frame of the previous segment (-1: none, a broken chain).
        prev = np.empty((steps, envs), dtype=np.int64)
        prev[1:] = serials[:-1]
        prev[0] = np.where(counts > 0, self._streams[streams, (counts - 1) % HISTORY], -1)
        self._put_frames(slots.ravel(), segment.frames.reshape(-1, *self.obs_shape[1:]))
        self._first[slots] = segment.first
        self._prev[slots] = prev
        for t in range(steps):
            self._streams[streams, (counts + t) % HISTORY] = serials[t]
        self._stream_steps[streams] = counts + steps

        order = np.lexsort((segment.obs_step, segment.env))
        env = segment.env[order]
        obs_step, next_step = segment.obs_step[order], segment.next_step[order]
        # An earlier step is addressable while the stream had it and this segment has not
        # reused its place in the history.
        back = -obs_step
        known = (obs_step >= 0) | ((back <= counts[env]) & (back <= HISTORY - steps))
        obs_serial = np.where(
            known, self._streams[streams[env], (counts[env] + obs_step) % HISTORY], -1
        )
        held = obs_serial >= self._written - self._capacity  # not overwritten since
        rows = order[held]
        obs = obs_serial[held] % self._capacity
        nxt = slots[next_step[held], env[held]]
        stored = self._store(
            obs,
            nxt,
            segment.action[rows],
            segment.reward[rows],
            segment.discount[rows],
            foreign=False,
        )
        self._expire()
        self._mirror_size()
        return stored

    def add(self, batch: LearnerTransitions, *, foreign: bool = False) -> None:
        """Store whole transitions, each frame they share with a neighbouring row once."""
        self.add_transitions(batch, foreign=foreign)

    def add_transitions(self, batch: LearnerTransitions, *, foreign: bool = False) -> np.ndarray:
        """`add`, returning the entries of the transitions stored, in the batch's order.

        The rows are stored in chains of consecutive stacks (`chain_order`),
        wherever they came from in the batch; any rows are stored exactly.
        """
        batch.validate(self.obs_shape, obs_dtype=np.dtype(np.uint8))
        rows = len(batch)
        if rows == 0:
            return np.zeros(0, dtype=np.int64)
        k = self._stack
        order = chain_order(batch.obs)
        obs, next_obs = batch.obs[order], batch.next_obs[order]
        # A row continues the previous one when its stack is that one's shifted by one frame.
        cont = np.zeros(rows, dtype=np.bool_)
        for i in range(1, rows):
            cont[i] = np.array_equal(obs[i, :-1], obs[i - 1, 1:])
        chain = np.cumsum(~cont)
        # A bootstrap stack that is a later row's observation in the same chain.
        ahead = np.zeros(rows, dtype=np.int64)
        for i in range(rows):
            for step in range(1, min(MATCH_AHEAD, rows - 1 - i) + 1):
                if chain[i + step] != chain[i]:
                    break
                if np.array_equal(next_obs[i], obs[i + step]):
                    ahead[i] = step
                    break

        # Entries in order: each chain's frames, then the frame that ends it (the final
        # observation of its episode, when rows bootstrap from it), then the stacks
        # matched to nothing, each a chain of its own.
        source: list[tuple[int, int, int]] = []  # (0: obs / 1: next_obs, row, frame)
        first: list[bool] = []
        obs_entry = np.zeros(rows, dtype=np.int64)
        next_entry = np.full(rows, -1, dtype=np.int64)

        def add_stack(kind: int, row: int) -> int:
            stack = obs[row] if kind == 0 else next_obs[row]
            start = 0
            while start < k - 1 and not stack[start].any():
                start += 1  # leading zero frames are rebuilt as the padding they are
            for frame in range(start, k):
                source.append((kind, row, frame))
                first.append(frame == start)
            return len(source) - 1

        start_row = 0
        for i in range(rows):
            if cont[i]:
                source.append((0, i, k - 1))
                first.append(False)
                obs_entry[i] = len(source) - 1
            else:
                start_row = i
                obs_entry[i] = add_stack(0, i)
            if i + 1 < rows and cont[i + 1]:
                continue
            # Row i ends its chain. Its last rows bootstrap from stacks past it (up to n
            # steps on, or the episode's final observation): the chain goes on through
            # them, one frame each.
            tail, tail_entry = obs[i], int(obs_entry[i])
            for j in range(start_row, i + 1):
                if ahead[j]:
                    continue
                if np.array_equal(next_obs[j], tail):
                    next_entry[j] = tail_entry
                elif np.array_equal(next_obs[j, :-1], tail[1:]):
                    source.append((1, j, k - 1))
                    first.append(False)
                    tail, tail_entry = next_obs[j], len(source) - 1
                    next_entry[j] = tail_entry
        matched = ahead > 0
        next_entry[matched] = obs_entry[np.flatnonzero(matched) + ahead[matched]]
        for unmatched in np.flatnonzero(next_entry < 0).tolist():
            next_entry[unmatched] = add_stack(1, unmatched)

        count = len(source)
        if count > self._capacity:
            raise ValueError(
                f"these {rows} transitions need {count} frames, more than the replay's "
                f"{self._capacity}"
            )
        slots = self._claim(count)
        kinds, src_rows, frames = (np.asarray(c, dtype=np.int64) for c in zip(*source, strict=True))
        for kind, column in ((0, obs), (1, next_obs)):
            picked = kinds == kind
            self._put_frames(slots[picked], column[src_rows[picked], frames[picked]])
        self._first[slots] = first
        self._prev[slots[1:]] = self._serial[slots[:-1]]
        self._prev[slots[0]] = -1
        stored = self._store(
            slots[obs_entry],
            slots[next_entry],
            batch.action[order],
            batch.reward[order],
            batch.discount[order],
            foreign=foreign,
        )
        self._expire()
        self._mirror_size()
        # Every link of these stacks was written just now: all are stored.
        in_batch_order = np.empty_like(stored)
        in_batch_order[order] = stored
        return in_batch_order

    def _grow_streams(self, count: int) -> None:
        if count > len(self._stream_steps):
            grown = np.full((count, HISTORY), -1, dtype=np.int64)
            grown[: len(self._streams)] = self._streams
            steps = np.zeros(count, dtype=np.int64)
            steps[: len(self._stream_steps)] = self._stream_steps
            self._streams, self._stream_steps = grown, steps

    def _claim(self, count: int) -> np.ndarray:
        """The next `count` entries of the ring, their old transitions dropped, serials set."""
        slots = (self._written + np.arange(count)) % self._capacity
        dying = slots[self._live[slots]]
        if dying.size:
            self._kill(dying)
        self._serial[slots] = self._written + np.arange(count)
        self._written += count
        return slots

    def _store(
        self,
        obs: np.ndarray,
        nxt: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        discount: np.ndarray,
        *,
        foreign: bool,
    ) -> np.ndarray:
        """Put transitions in the entries of their observations; returns the entries kept."""
        obs_entries, intact, oldest = self._walk(obs)
        next_entries, next_intact, _ = self._walk(nxt)
        keep = intact & next_intact
        slots: np.ndarray = obs[keep]
        self._next[slots] = nxt[keep]
        self._action[slots] = action[keep]
        self._reward[slots] = reward[keep]
        self._discount[slots] = discount[keep]
        self._oldest[slots] = oldest[keep]
        if slots.size:
            self._span = max(self._span, int((self._serial[slots] - oldest[keep]).max()))
        self._foreign[slots] = foreign
        self._size += int((~self._live[slots]).sum())
        self._live[slots] = True
        self._tree.set(slots, np.full(slots.shape[0], self._max_priority))
        if self.mirror is not None and slots.size:
            self.mirror.write_stacked(
                slots,
                obs_entries[keep],
                action[keep],
                reward[keep],
                next_entries[keep],
                discount[keep],
            )
        return slots

    def _expire(self) -> None:
        """Drop the transitions whose oldest frame has just been overwritten.

        Such a transition sits in an entry at most `span` past the oldest
        frame still held: only those entries need a look.
        """
        cutoff = self._written - self._capacity
        if cutoff <= 0:
            return
        slots = (cutoff + np.arange(min(self._span, self._capacity))) % self._capacity
        stale = slots[self._live[slots] & (self._oldest[slots] < cutoff)]
        if stale.size:
            self._kill(stale)

    def _kill(self, slots: np.ndarray) -> None:
        self._size -= int(self._live[slots].sum())
        self._live[slots] = False
        self._tree.set(slots, np.zeros(slots.shape[0]))
        if self.mirror is not None:
            self.mirror.remove(slots)

    def _put_frames(self, entries: np.ndarray, frames: np.ndarray) -> None:
        self._frames[entries] = frames
        if self.mirror is not None and entries.size:
            self.mirror.write_frames(entries, frames)

    def _mirror_size(self) -> None:
        if self.mirror is not None:
            self.mirror.set_size(self._size)

    def _mirror_layout(self) -> tuple[int | None, torch.dtype]:
        return self._stack, torch.uint8

    def _copy_to(self, mirror: DeviceReplay) -> None:
        mirror.write_frames(np.arange(self._capacity), self._frames[: self._capacity])
        live = np.flatnonzero(self._live)
        if not live.size:
            return
        obs_entries, _, _ = self._walk(live)
        next_entries, _, _ = self._walk(self._next[live])
        mirror.write_stacked(
            live,
            obs_entries,
            self._action[live],
            self._reward[live],
            next_entries,
            self._discount[live],
        )
        mirror.set_priorities(live, self._tree.get(live), self._max_priority)

    # -- stacks --------------------------------------------------------------

    def _walk(self, newest: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each stack's k entries, oldest first (the pad where the chain started), whether every
        link still holds the frame it was made with, and the oldest serial it needs."""
        k = self._stack
        entries = np.empty((len(newest), k), dtype=np.int64)
        entries[:, -1] = newest
        intact = np.ones(len(newest), dtype=np.bool_)
        current = newest
        for column in range(k - 2, -1, -1):
            stop = self._first[current]
            back = self._prev[current]
            slot = np.maximum(back, 0) % self._capacity
            # A link is broken when it is missing, or its frame has been overwritten.
            broken = ~stop & ((back < 0) | (self._serial[slot] != back))
            intact &= ~broken
            current = np.where(stop | broken, self._pad, slot)
            entries[:, column] = current
        oldest = self._serial[entries].min(axis=1)
        return entries, intact, oldest

    def stacks(self, entries: np.ndarray) -> np.ndarray:
        """uint8 [B, k, H, W]: the stacks whose newest frames are in `entries`."""
        walked, _, _ = self._walk(np.asarray(entries, dtype=np.int64))
        stacked: np.ndarray = self._frames[walked]
        return stacked

    def transitions(self, slots: np.ndarray) -> LearnerTransitions:
        """The stored transitions in `slots`, their stacks rebuilt."""
        return LearnerTransitions(
            obs=self.stacks(slots),
            action=self._action[slots],
            reward=self._reward[slots],
            next_obs=self.stacks(self._next[slots]),
            discount=self._discount[slots],
        )

    def recent(self, count: int) -> LearnerTransitions:
        """The newest `count` live transitions (all, if fewer), oldest first, stacks rebuilt."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        held = min(self._written, self._capacity)
        newest_first = (self._written - 1 - np.arange(held)) % self._capacity
        live = newest_first[self._live[newest_first]][:count]
        return self.transitions(live[::-1])

    # -- sampling ------------------------------------------------------------

    def sample(self, batch_size: int, beta: float) -> SampledBatch:
        """Draw batch_size live transitions (with replacement) and their importance weights."""
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        slots = self._draw(batch_size)
        if self.prioritized:
            probabilities = self._tree.get(slots) / self._tree.total
            weights = (self._size * probabilities) ** (-beta)
            weights = (weights / weights.max()).astype(np.float32)
        else:
            weights = np.ones(batch_size, dtype=np.float32)
        return SampledBatch(
            batch=self.transitions(slots),
            indices=slots,
            weights=weights,
            foreign=self._foreign[slots],
        )

    def _draw(self, batch_size: int) -> np.ndarray:
        """Stratified draws from the priority tree.

        Dead entries have priority 0, but float rounding can carry a target
        just past a live leaf into a dead one: such a pick is drawn again.
        """
        slots = np.zeros(batch_size, dtype=np.int64)
        todo = np.arange(batch_size)
        for _ in range(_REDRAWS):
            total = self._tree.total
            targets = (todo + self._rng.random(len(todo))) * (total / batch_size)
            found = self._tree.find(np.minimum(targets, np.nextafter(total, 0)))
            picks = np.minimum(found, self._capacity - 1)
            alive = self._live[picks]
            slots[todo[alive]] = picks[alive]
            todo = todo[~alive]
            if not todo.size:
                return slots
        slots[todo] = self._rng.choice(np.flatnonzero(self._live), size=len(todo))
        return slots

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        """Set the priorities of sampled transitions from their new |TD errors|.

        Entries that died since they were drawn keep priority 0. A no-op for
        uniform replay.
        """
        indices, td_abs = checked_priority_update(indices, td_abs, bound=self._capacity)
        if not self.prioritized or indices.size == 0:
            return
        alive = self._live[indices]
        priorities = (np.abs(td_abs[alive]) + self._eps) ** self._alpha
        if priorities.size:
            self._tree.set(indices[alive].astype(np.int64, copy=False), priorities)
            self._max_priority = max(self._max_priority, float(priorities.max()))


def make_replay(
    capacity: int,
    obs_shape: tuple[int, ...],
    *,
    prioritized: bool,
    alpha: float,
    eps: float,
    seed: int,
) -> PrioritizedReplay | FrameReplay:
    """The replay for observations of `obs_shape`: frames kept once for image stacks, plain
    rows for anything else."""
    kind = FrameReplay if is_image(obs_shape) else PrioritizedReplay
    return kind(capacity, obs_shape, prioritized=prioritized, alpha=alpha, eps=eps, seed=seed)


@runtime_checkable
class FrameStore(Protocol):
    """A replay that takes actors' frame segments (a FrameReplay, or a mix whose local one is)."""

    def add_frames(self, streams: np.ndarray, segment: FrameSegment) -> np.ndarray: ...

    def transitions(self, slots: np.ndarray) -> LearnerTransitions: ...


def chain_order(obs: np.ndarray) -> np.ndarray:
    """An order of rows in which each stack continues the one before wherever rows allow.

    Rows of one env's consecutive steps may arrive apart (an actor's segments
    interleave its envs); put back one after the other, each shares k − 1
    frames with its neighbour, which `FrameReplay.add` stores once and a
    compressor finds at once. Rows are linked by their newest frame (the
    next row's second newest), confirmed on the whole overlap; any row that
    continues nothing starts a chain. The order changes no row's content.
    """
    rows = len(obs)
    by_second_newest: dict[bytes, list[int]] = {}
    for i in range(rows):
        by_second_newest.setdefault(obs[i, -2].tobytes(), []).append(i)
    successor = np.full(rows, -1, dtype=np.int64)
    has_predecessor = np.zeros(rows, dtype=np.bool_)
    for i in range(rows):
        for j in by_second_newest.get(obs[i, -1].tobytes(), ()):
            if j != i and not has_predecessor[j] and np.array_equal(obs[j, :-1], obs[i, 1:]):
                successor[i], has_predecessor[j] = j, True
                break
    order: list[int] = []
    placed = np.zeros(rows, dtype=np.bool_)
    # Chains start where nothing leads in; what is left is cycles (identical stacks).
    for start in [*np.flatnonzero(~has_predecessor), *range(rows)]:
        row = int(start)
        while row >= 0 and not placed[row]:
            placed[row] = True
            order.append(row)
            row = int(successor[row])
    return np.asarray(order, dtype=np.int64)
