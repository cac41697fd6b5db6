"""The opponents the learner fields, in shared memory: a fixed number of network slots and odds.

The league (fedrl.client.training.league) may hold any number of opponents;
the actors see only what this board holds: `slots` networks, each with its
league id, and the probability of drawing each opponent for a new game (the
latest policy, the fixed players, the slotted networks). Its size is fixed
when it is made, so an actor's memory is the same whatever the league's.

It is a WeightsBoard (fedrl.client.training.shm) whose arrays are a table
[2, entries] (row 0 the ids, row 1 the probabilities) and the slots'
networks, each named "slot<i>/<tensor name>": one sequence lock covers
table and weights, so an actor never reads odds that do not match the
networks it loads. Ids travel as float32, exact below 2^24 (the league
refuses more entries).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedrl.client.training.shm import BoardLayout, WeightsBoard
from fedrl.envs.board_games import BASELINES
from fedrl.envs.two_player import BASELINE_IDS, LATEST

NamedArrays = Sequence[tuple[str, npt.NDArray[np.float32]]]
MAX_ID = 2**24
"""Ids at or above this do not fit the table's float32 exactly."""
EMPTY = -1
"""The id of an empty slot."""
FIXED = (LATEST, *(BASELINE_IDS[name] for name in BASELINES))
"""The opponents every table lists first, who need no slot: the latest policy and the baselines."""


@dataclass(frozen=True)
class Fielded:
    """What the board shows: the odds of the fixed opponents and of each slotted network."""

    fixed_odds: tuple[float, ...]
    """Probabilities of the opponents in FIXED, in that order."""
    ids: tuple[int, ...]
    """League ids of the slotted networks (at most `slots`)."""
    odds: tuple[float, ...]
    """Their probabilities."""
    weights: tuple[NamedArrays, ...]
    """Their networks."""

    def table(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        ids = np.asarray([*FIXED, *self.ids], dtype=np.int64)
        odds = np.asarray([*self.fixed_odds, *self.odds], dtype=np.float64)
        return ids, odds


def board_layout(network: NamedArrays, slots: int) -> BoardLayout:
    """The layout of a board with `slots` slots for networks shaped like `network`."""
    arrays: list[tuple[str, npt.NDArray[np.float32]]] = [
        ("table", np.zeros((2, len(FIXED) + slots), dtype=np.float32))
    ]
    for slot in range(slots):
        arrays += [(f"slot{slot}/{name}", array) for name, array in network]
    return BoardLayout.of(arrays)


def slots_of(layout: BoardLayout) -> int:
    """How many network slots a board of `layout` has."""
    (_, (_, entries)) = layout.shapes[0]
    return entries - len(FIXED)


def publish(board: WeightsBoard, fielded: Fielded) -> int:
    """Write `fielded` to the board (empty slots get zeros and odds 0); the new version."""
    slots = slots_of(board.layout)
    if len(fielded.ids) > slots or len(fielded.ids) != len(fielded.weights):
        raise ValueError(f"{len(fielded.ids)} networks for {slots} slots")
    if any(not 0 <= i < MAX_ID for i in fielded.ids):
        raise ValueError(f"opponent ids must lie in [0, {MAX_ID}), got {fielded.ids}")
    ids, odds = fielded.table()
    table = np.zeros((2, len(FIXED) + slots), dtype=np.float32)
    table[0] = EMPTY
    table[0, : len(ids)] = ids
    table[1, : len(odds)] = odds
    arrays: list[tuple[str, npt.NDArray[np.float32]]] = [("table", table)]
    shapes = dict(board.layout.shapes)
    for slot in range(slots):
        prefix = f"slot{slot}/"
        if slot < len(fielded.weights):
            arrays += [
                (prefix + name, np.asarray(a, np.float32)) for name, a in fielded.weights[slot]
            ]
        else:
            arrays += [
                (name, np.zeros(shape, dtype=np.float32))
                for name, shape in shapes.items()
                if name.startswith(prefix)
            ]
    return board.publish(arrays)


@dataclass(frozen=True)
class BoardView:
    """One consistent read of a board: the draw table and each slotted network."""

    version: int
    ids: npt.NDArray[np.int64]
    odds: npt.NDArray[np.float64]
    networks: dict[int, list[tuple[str, npt.NDArray[np.float32]]]]
    """Weights by league id, for the slots that hold one."""


def read(board: WeightsBoard) -> BoardView:
    """The board as it is now (a copy)."""
    version, arrays = board.read()
    table = arrays[0][1]
    ids = np.rint(table[0]).astype(np.int64)
    odds = table[1].astype(np.float64)
    networks: dict[int, list[tuple[str, npt.NDArray[np.float32]]]] = {}
    for slot in range(slots_of(board.layout)):
        league_id = int(ids[len(FIXED) + slot])
        if league_id == EMPTY:
            continue
        prefix = f"slot{slot}/"
        networks[league_id] = [
            (name.removeprefix(prefix), array) for name, array in arrays if name.startswith(prefix)
        ]
    keep = ids != EMPTY
    return BoardView(version=version, ids=ids[keep], odds=odds[keep], networks=networks)
