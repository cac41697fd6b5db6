"""Shared memory between actors and learner: a ring of slots and a weights board.

A slot holds one actor's batch: n-step transitions for DQN (`RingLayout`,
`TransitionSlot`) or one rollout for PPO (`RolloutLayout`, `RolloutSlot`;
Atari's frame stacks as single frames, fedrl.client.training.frame_stacks);
`SlotRing` is the segment either kind of slot lives in (and DQN's frame
slots, fedrl.client.training.frame_slots).

Both are plain `multiprocessing.shared_memory` segments named with the
`fedrl_` prefix, created by the learner process, which alone unlinks them.
Actors only attach. On Python 3.11 an attaching process registers the segment
with the resource tracker it shares with its parent (a set, so a no-op), and
if the learner dies without unlinking, that tracker unlinks every registered
segment once the last process of the tree is gone: no segment outlives the run.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from fedrl.client.training.frame_stacks import join_stacks, split_stacks
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.envs.two_player import NO_OPPONENT

SEGMENT_PREFIX = "fedrl_"
_ALIGN = 64


def _segment_name(kind: str) -> str:
    # Random suffix: several runs (and test sessions) share /dev/shm.
    return f"{SEGMENT_PREFIX}{kind}_{secrets.token_hex(6)}"


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


FieldSpec = tuple[str, tuple[int, ...], np.dtype[np.generic]]
"""One array of a slot: its name, shape and dtype."""


def _fields_bytes(fields: list[FieldSpec]) -> int:
    return sum(_aligned(int(np.prod(shape)) * dtype.itemsize) for _, shape, dtype in fields)


def _views(buf: memoryview, offset: int, fields: list[FieldSpec]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for name, shape, dtype in fields:
        arrays[name] = np.ndarray(shape, dtype=dtype, buffer=buf, offset=offset)
        offset += _aligned(int(np.prod(shape)) * dtype.itemsize)
    return arrays


@dataclass(frozen=True)
class RingLayout:
    """Geometry of the transition ring; actors rebuild the same views from it."""

    num_slots: int
    rows_per_slot: int
    episodes_per_slot: int
    obs_shape: tuple[int, ...]
    obs_dtype: str = "float32"
    """float32, or uint8 for images."""

    def _fields(self) -> list[FieldSpec]:
        r, e = self.rows_per_slot, self.episodes_per_slot
        return [
            ("obs", (r, *self.obs_shape), np.dtype(self.obs_dtype)),
            ("next_obs", (r, *self.obs_shape), np.dtype(self.obs_dtype)),
            ("action", (r,), np.dtype(np.int64)),
            ("reward", (r,), np.dtype(np.float32)),
            ("discount", (r,), np.dtype(np.float32)),
            ("opponent", (r,), np.dtype(np.int64)),
            ("episode_return", (e,), np.dtype(np.float64)),
            ("episode_length", (e,), np.dtype(np.int64)),
            ("episode_opponent", (e,), np.dtype(np.int64)),
        ]

    @property
    def slot_bytes(self) -> int:
        return _fields_bytes(self._fields())

    def make_slot(self, buf: memoryview, offset: int) -> TransitionSlot:
        return TransitionSlot(buf, offset, self)


@dataclass(frozen=True)
class SlotFill:
    """How much of a slot an actor filled; the only thing that crosses the pipe."""

    slot: int
    rows: int
    episodes: int
    env_steps: int


class TransitionSlot:
    """Numpy views of one slot of the ring."""

    def __init__(self, buf: memoryview, offset: int, layout: RingLayout) -> None:
        self.arrays = _views(buf, offset, layout._fields())
        self.rows_capacity = layout.rows_per_slot
        self.episodes_capacity = layout.episodes_per_slot

    def write(
        self,
        batch: LearnerTransitions,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
        *,
        opponents: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """`opponents`: two-player games' opponent id of each ended episode."""
        rows, episodes = len(batch), len(episode_returns)
        if rows > self.rows_capacity or episodes > self.episodes_capacity:
            raise ValueError(
                f"slot holds {self.rows_capacity} rows and {self.episodes_capacity} episodes, "
                f"got {rows} and {episodes}"
            )
        a = self.arrays
        a["obs"][:rows] = batch.obs
        a["next_obs"][:rows] = batch.next_obs
        a["action"][:rows] = batch.action
        a["reward"][:rows] = batch.reward
        a["discount"][:rows] = batch.discount
        a["opponent"][:rows] = NO_OPPONENT if batch.opponent is None else batch.opponent
        a["episode_return"][:episodes] = episode_returns
        a["episode_length"][:episodes] = episode_lengths
        _write_opponents(a, episodes, opponents)

    def opponents(self, fill: SlotFill) -> npt.NDArray[np.int64]:
        """The opponent id of each episode the fill ended (a copy)."""
        return _read_opponents(self.arrays, fill, self.episodes_capacity)

    def read(
        self, fill: SlotFill
    ) -> tuple[LearnerTransitions, npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """Copies out, so the slot can go back to its actor at once."""
        if not (
            0 <= fill.rows <= self.rows_capacity and 0 <= fill.episodes <= self.episodes_capacity
        ):
            raise ValueError(f"slot fill {fill} exceeds the slot's capacity")
        a, n = self.arrays, fill.rows
        batch = LearnerTransitions(
            obs=a["obs"][:n].copy(),
            action=a["action"][:n].copy(),
            reward=a["reward"][:n].copy(),
            next_obs=a["next_obs"][:n].copy(),
            discount=a["discount"][:n].copy(),
            opponent=_opponents_of(a["opponent"][:n]),
        )
        returns = np.asarray(a["episode_return"][: fill.episodes], dtype=np.float64).copy()
        lengths = np.asarray(a["episode_length"][: fill.episodes], dtype=np.int64).copy()
        return batch, returns, lengths


@dataclass(frozen=True)
class RolloutLayout:
    """Geometry of a PPO rollout slot: `steps` vector steps of `envs` envs."""

    num_slots: int
    steps: int
    envs: int
    obs_shape: tuple[int, ...]
    action_shape: tuple[int, ...]
    """() for Discrete actions (int64), (d,) for Box actions (float32)."""
    obs_dtype: str = "float32"
    """float32, or uint8 for images."""
    frame_stacks: bool = False
    """Observations are Atari's frame stacks: held as single frames."""

    @property
    def episodes_per_slot(self) -> int:
        # An episode spans at least two vector steps (its last one and the
        # autoreset step), except one ending on the rollout's first step.
        return self.envs * (self.steps // 2 + 1)

    def _fields(self) -> list[FieldSpec]:
        t, e = self.steps, self.envs
        action_dtype = np.float32 if self.action_shape else np.int64
        observations: list[FieldSpec] = [("obs", (t, e, *self.obs_shape), np.dtype(self.obs_dtype))]
        if self.frame_stacks:
            observations = [
                ("frames", (t, e, *self.obs_shape[1:]), np.dtype(np.uint8)),
                ("first", (e, *self.obs_shape), np.dtype(np.uint8)),
                ("starts", (t, e), np.dtype(np.bool_)),
            ]
        return [
            *observations,
            ("action", (t, e, *self.action_shape), np.dtype(action_dtype)),
            ("log_prob", (t, e), np.dtype(np.float32)),
            ("value", (t + 1, e), np.dtype(np.float32)),
            ("reward", (t, e), np.dtype(np.float32)),
            ("terminated", (t, e), np.dtype(np.bool_)),
            ("truncated", (t, e), np.dtype(np.bool_)),
            ("valid", (t, e), np.dtype(np.bool_)),
            ("episode_return", (self.episodes_per_slot,), np.dtype(np.float64)),
            ("episode_length", (self.episodes_per_slot,), np.dtype(np.int64)),
            ("episode_opponent", (self.episodes_per_slot,), np.dtype(np.int64)),
        ]

    @property
    def slot_bytes(self) -> int:
        return _fields_bytes(self._fields())

    def make_slot(self, buf: memoryview, offset: int) -> RolloutSlot:
        return RolloutSlot(buf, offset, self)


_ROLLOUT_COLUMNS = (
    "action",
    "log_prob",
    "value",
    "reward",
    "terminated",
    "truncated",
    "valid",
)


class RolloutSlot:
    """Numpy views of one rollout slot."""

    def __init__(self, buf: memoryview, offset: int, layout: RolloutLayout) -> None:
        self.arrays = _views(buf, offset, layout._fields())
        self.episodes_capacity = layout.episodes_per_slot
        self.frame_stacks = layout.frame_stacks

    def write(
        self,
        rollout: Rollout,
        episode_returns: npt.NDArray[np.float64],
        episode_lengths: npt.NDArray[np.int64],
        *,
        opponents: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """`opponents`: two-player games' opponent id of each ended episode."""
        episodes = len(episode_returns)
        if episodes > self.episodes_capacity:
            raise ValueError(f"slot holds {self.episodes_capacity} episodes, got {episodes}")
        columns: dict[str, np.ndarray] = {"obs": rollout.obs}
        if self.frame_stacks:
            frames, first, starts = split_stacks(rollout.obs)
            columns = {"frames": frames, "first": first, "starts": starts}
        columns |= {name: getattr(rollout, name) for name in _ROLLOUT_COLUMNS}
        for name, column in columns.items():
            target = self.arrays[name]
            if target.shape != column.shape:
                raise ValueError(
                    f"rollout {name} has shape {column.shape}, the slot {target.shape}"
                )
            target[...] = column
        self.arrays["episode_return"][:episodes] = episode_returns
        self.arrays["episode_length"][:episodes] = episode_lengths
        _write_opponents(self.arrays, episodes, opponents)

    def opponents(self, fill: SlotFill) -> npt.NDArray[np.int64]:
        """The opponent id of each episode the fill ended (a copy)."""
        return _read_opponents(self.arrays, fill, self.episodes_capacity)

    def read(
        self, fill: SlotFill
    ) -> tuple[Rollout, npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """Copies out; `fill.rows` is unused (a rollout always fills its slot)."""
        if not 0 <= fill.episodes <= self.episodes_capacity:
            raise ValueError(f"slot fill {fill} exceeds the slot's capacity")
        a = self.arrays
        obs = (
            join_stacks(a["frames"], a["first"], a["starts"])
            if self.frame_stacks
            else a["obs"].copy()
        )
        rollout = Rollout(obs=obs, **{name: a[name].copy() for name in _ROLLOUT_COLUMNS})
        returns = np.asarray(a["episode_return"][: fill.episodes], dtype=np.float64).copy()
        lengths = np.asarray(a["episode_length"][: fill.episodes], dtype=np.int64).copy()
        return rollout, returns, lengths


def _opponents_of(column: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | None:
    """A slot's per-row opponents as LearnerTransitions holds them: None where no row has one
    (every env but a two-player game)."""
    return column.copy() if len(column) and column.max() != NO_OPPONENT else None


def _write_opponents(
    arrays: dict[str, np.ndarray], episodes: int, opponents: npt.NDArray[np.int64] | None
) -> None:
    column = arrays["episode_opponent"]
    if opponents is None:
        column[:episodes] = NO_OPPONENT
        return
    if len(opponents) != episodes:
        raise ValueError(f"{len(opponents)} opponents for {episodes} episodes")
    column[:episodes] = opponents


def _read_opponents(
    arrays: dict[str, np.ndarray], fill: SlotFill, capacity: int
) -> npt.NDArray[np.int64]:
    if not 0 <= fill.episodes <= capacity:
        raise ValueError(f"slot fill {fill} exceeds the slot's capacity")
    return np.asarray(arrays["episode_opponent"][: fill.episodes], dtype=np.int64).copy()


S_co = TypeVar("S_co", covariant=True)


class SlotLayout(Protocol[S_co]):
    """What a ring needs of a slot kind: how many, how large, and views of one."""

    @property
    def num_slots(self) -> int: ...

    @property
    def slot_bytes(self) -> int: ...

    def make_slot(self, buf: memoryview, offset: int) -> S_co: ...


SlotT = TypeVar("SlotT")


class SlotRing(Generic[SlotT]):
    """Preallocated slots that actors fill and the learner drains; pipes carry only slot indices."""

    def __init__(self, layout: SlotLayout[SlotT], *, name: str | None = None) -> None:
        self.layout = layout
        self._owner = name is None
        if name is None:
            self._shm = shared_memory.SharedMemory(
                name=_segment_name("ring"),
                create=True,
                size=max(1, layout.num_slots * layout.slot_bytes),
            )
        else:
            self._shm = shared_memory.SharedMemory(name=name)
        self.name = self._shm.name
        buf = self._shm.buf
        assert buf is not None
        self.slots: list[SlotT] = [
            layout.make_slot(buf, i * layout.slot_bytes) for i in range(layout.num_slots)
        ]
        self._closed = False

    def close(self) -> None:
        """Detach; the creating process also unlinks. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self.slots = []
        _release(self._shm, unlink=self._owner)


@dataclass(frozen=True)
class BoardLayout:
    """Names and shapes of the weights, in the learner's order."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def of(cls, arrays: Sequence[tuple[str, npt.NDArray[np.generic]]]) -> BoardLayout:
        return cls(shapes=tuple((n, tuple(int(d) for d in a.shape)) for n, a in arrays))

    @property
    def num_floats(self) -> int:
        return sum(int(np.prod(s)) for _, s in self.shapes)


class WeightsBoard:
    """The newest weights in shared memory behind a sequence lock.

    The writer makes the counter odd, copies, and makes it even again; a
    reader copies between two reads of an even, unchanged counter, else it
    retries, so it never keeps a torn mix of two versions. The version is the
    number of completed writes. Ordering relies on x86-64/AArch64 keeping a
    process's own stores to one mapping in program order as numpy issues them;
    the header also carries a stop flag that actors check between batches.
    """

    _SEQ, _STOP = 0, 1

    def __init__(self, layout: BoardLayout, *, name: str | None = None) -> None:
        self.layout = layout
        self._owner = name is None
        size = 16 + 4 * layout.num_floats
        if name is None:
            self._shm = shared_memory.SharedMemory(
                name=_segment_name("weights"), create=True, size=size
            )
        else:
            self._shm = shared_memory.SharedMemory(name=name)
        self.name = self._shm.name
        self._header = np.ndarray((2,), dtype=np.int64, buffer=self._shm.buf)
        self._flat = np.ndarray(
            (layout.num_floats,), dtype=np.float32, buffer=self._shm.buf, offset=16
        )
        if self._owner:
            self._header[:] = 0
        self._closed = False

    @property
    def version(self) -> int:
        return int(self._header[self._SEQ]) // 2

    @property
    def stop_requested(self) -> bool:
        return bool(self._header[self._STOP])

    def request_stop(self) -> None:
        self._header[self._STOP] = 1

    def publish(self, arrays: Sequence[tuple[str, npt.NDArray[np.generic]]]) -> int:
        """Writes a new version; returns its number."""
        if BoardLayout.of(arrays) != self.layout:
            raise ValueError("weights do not match the board's names and shapes")
        self._header[self._SEQ] += 1
        offset = 0
        for _, a in arrays:
            n = a.size
            self._flat[offset : offset + n] = a.reshape(-1)
            offset += n
        self._header[self._SEQ] += 1
        return self.version

    def read(
        self, *, timeout_s: float = 5.0
    ) -> tuple[int, list[tuple[str, npt.NDArray[np.float32]]]]:
        """A consistent copy of the newest weights and their version."""
        deadline = time.monotonic() + timeout_s
        while True:
            before = int(self._header[self._SEQ])
            if before % 2 == 0:
                flat = self._flat.copy()
                if int(self._header[self._SEQ]) == before:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("weights board stayed mid-write; the learner may have died")
            time.sleep(0)
        out: list[tuple[str, npt.NDArray[np.float32]]] = []
        offset = 0
        for name, shape in self.layout.shapes:
            n = int(np.prod(shape))
            out.append((name, flat[offset : offset + n].reshape(shape)))
            offset += n
        return before // 2, out

    def close(self) -> None:
        """Detach; the creating process also unlinks. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        # Views into the mapping must go before it can be closed.
        self._header = self._flat = np.zeros(0)
        _release(self._shm, unlink=self._owner)


def _release(shm: shared_memory.SharedMemory, *, unlink: bool) -> None:
    # BufferError: a numpy view still points into the mapping; the segment is
    # still unlinked below, and the mapping goes with the process.
    with contextlib.suppress(BufferError):
        shm.close()
    if unlink:
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
