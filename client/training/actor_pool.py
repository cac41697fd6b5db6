"""The engine's actors: processes spawned on shared-memory slots, supervised and restarted.

Each actor process owns a fixed range of the slot ring
(fedrl.client.training.shm): the learner's side hands it free slot numbers
through one pipe and hears of filled ones through another, so pipes carry
slot indices, never data. Weights reach the actors through one versioned
WeightsBoard. A slot announced as filled is held by the learner's side until
it is freed, so a successor never gets a slot whose content is still in use.
An actor that dies is replaced on the same slots with a fresh seed stream, up
to `max_restarts` times. With one core the pool holds a single actor core in
this process instead (serial mode), which the schedules step themselves.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import numpy.typing as npt

from fedrl.client.training.actor import (
    SLOT_FORMAT,
    ActorCore,
    ActorSpec,
    actor_process,
    parse_fill,
)
from fedrl.client.training.frame_actor import FrameActorCore, FrameActorSpec
from fedrl.client.training.frame_slots import SlotLayout
from fedrl.client.training.ppo_actor import PPOActorCore, PPOActorSpec
from fedrl.client.training.shm import BoardLayout, SlotFill, SlotRing, WeightsBoard

AnyActorSpec = ActorSpec | PPOActorSpec | FrameActorSpec
AnyActorCore = ActorCore | PPOActorCore | FrameActorCore
SpecOf = Callable[[int, int, int], AnyActorSpec]
"""The spec of actor (index, of num_actors, in its generation-th life)."""
NamedArrays = Sequence[tuple[str, npt.NDArray[Any]]]


class ActorFailureError(RuntimeError):
    """An actor process died more often than the engine may restart it."""


@dataclass
class ActorHandle:
    """One live actor process, the pipes to it and the slots it fills."""

    spec: AnyActorSpec
    process: BaseProcess
    free_slots: Connection
    filled_slots: Connection
    slots: range
    restarts: int = 0
    generation: int = 0
    """Lives before this one (restarts and respawns with new hyperparameters): its seed stream."""


class ActorPool:
    """The actors one schedule collects with: processes on a slot ring, or one core in-process."""

    def __init__(self, *, spec_of: SpecOf, max_restarts: int) -> None:
        self._spec_of = spec_of
        self._max_restarts = max_restarts
        self.serial: AnyActorCore | None = None
        """The actor of serial mode, stepped by the schedule in this process."""
        self.actors: list[ActorHandle] = []
        """The actor processes, by index (parallel mode)."""
        self.ring: SlotRing[Any] | None = None
        self._board: WeightsBoard | None = None
        self._held: set[int] = set()
        self._workers = 0
        self._serial_generation = 0

    @property
    def started(self) -> bool:
        """Whether actors are there to take weights (serial or processes)."""
        return self.serial is not None or self._board is not None

    def start_serial(self, weights: NamedArrays, version: int) -> None:
        """The one actor that runs in this process, holding `weights`."""
        self.serial = self._serial_actor(generation=0)
        self.serial.load_weights(weights, version)

    def start_processes(
        self, layout: SlotLayout, *, workers: int, slots_per_actor: int, weights: NamedArrays
    ) -> None:
        """`workers` actor processes on a ring of `layout`, each owning `slots_per_actor` slots."""
        self._workers = workers
        self.ring = SlotRing(layout)
        self._board = WeightsBoard(BoardLayout.of(weights))
        self._board.publish(weights)
        for index in range(workers):
            slots = range(index * slots_per_actor, (index + 1) * slots_per_actor)
            self.actors.append(self._spawn(index, slots, generation=0))

    def publish(self, weights: NamedArrays, version: int) -> None:
        """Hand the actors new weights: on the board for processes, directly to the serial one."""
        if self._board is not None:
            self._board.publish(weights)
        if self.serial is not None:
            self.serial.load_weights(weights, version)

    def receive(self, timeout_s: float) -> list[tuple[ActorHandle, SlotFill]]:
        """Every slot announced within the timeout, with the actor that filled it (held until
        freed)."""
        by_conn = {a.filled_slots: a for a in self.actors}
        received = []
        for conn in wait(list(by_conn), timeout=timeout_s):
            actor = by_conn[conn]  # type: ignore[index]
            try:
                message = actor.filled_slots.recv_bytes()
            except (EOFError, OSError):
                continue  # the actor is gone; check() deals with it
            fill = parse_fill(message)
            if fill.slot not in actor.slots:
                raise ActorFailureError(
                    f"actor {actor.spec.index} announced slot {fill.slot}, not its own"
                )
            self._held.add(fill.slot)
            received.append((actor, fill))
        return received

    def free(self, actor_index: int, slot: int) -> None:
        """Give a slot back to the actor that owns it (its successor, if it died)."""
        self._held.discard(slot)
        with contextlib.suppress(OSError):
            self.actors[actor_index].free_slots.send_bytes(SLOT_FORMAT.pack(slot))

    def check(self, take: Callable[[ActorHandle, SlotFill], None]) -> None:
        """Replace dead actors, after `take` got what they finished; ActorFailureError past the
        restart budget."""
        for position, actor in enumerate(self.actors):
            code = actor.process.exitcode
            if code is None:
                continue
            cause = describe_exit(code)
            if actor.restarts >= self._max_restarts:
                raise ActorFailureError(
                    f"actor {actor.spec.index} {cause} and was already restarted "
                    f"{actor.restarts} times (max_actor_restarts); stopping. "
                    "Its traceback, if any, is printed above."
                )
            # Whatever it finished before dying is still good experience.
            while True:
                try:
                    if not actor.filled_slots.poll(0):
                        break
                    message = actor.filled_slots.recv_bytes()
                except (EOFError, OSError):
                    break
                fill = parse_fill(message)
                self._held.add(fill.slot)
                take(actor, fill)
            self._replace(position, restarts=actor.restarts + 1)

    def restart(self, layout: SlotLayout | None = None) -> None:
        """New actors with the current specs (new hyperparameters); what the old ones held is
        dropped, and the failure budget is untouched. A `layout` other than the ring's (a
        new n-step changes how many rows a slot holds) puts them on a new ring of it."""
        if self.serial is not None:
            self.serial.close()
            self._serial_generation += 1
            self.serial = self._serial_actor(self._serial_generation)
        for actor in self.actors:
            actor.process.kill()
            actor.process.join(timeout=5.0)
        if layout is not None and self.ring is not None and layout != self.ring.layout:
            self.ring.close()
            self.ring = SlotRing(layout)
            self._held.clear()
        for position, actor in enumerate(self.actors):
            self._replace(position, restarts=actor.restarts)

    def pids(self) -> list[int]:
        """Process ids of the live actor processes (empty in serial mode)."""
        return [a.process.pid for a in self.actors if a.process.pid is not None]

    def close(self) -> None:
        """Stops the actors and frees every shared-memory segment; safe to call twice."""
        if self._board is not None:
            self._board.request_stop()
        for actor in self.actors:
            with contextlib.suppress(OSError):
                actor.free_slots.close()
        for actor in self.actors:
            actor.process.join(timeout=5.0)
            if actor.process.is_alive():
                actor.process.kill()
                actor.process.join(timeout=5.0)
            with contextlib.suppress(OSError):
                actor.filled_slots.close()
        self.actors = []
        if self.serial is not None:
            self.serial.close()
            self.serial = None
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self._board is not None:
            self._board.close()
            self._board = None

    def _serial_actor(self, generation: int) -> AnyActorCore:
        """The one actor that runs in this process, for its `generation`'s seed stream."""
        spec = self._spec_of(0, 1, generation)
        if isinstance(spec, FrameActorSpec):
            return FrameActorCore(spec)
        if isinstance(spec, ActorSpec):
            return ActorCore(spec)
        return PPOActorCore(spec)

    def _replace(self, position: int, *, restarts: int) -> None:
        """A successor on the same slots, in the next generation, for an actor that is gone."""
        actor = self.actors[position]
        with contextlib.suppress(OSError):
            actor.free_slots.close()
            actor.filled_slots.close()
        self.actors[position] = self._spawn(
            actor.spec.index, actor.slots, generation=actor.generation + 1, restarts=restarts
        )

    def _spawn(
        self, index: int, slots: range, *, generation: int, restarts: int = 0
    ) -> ActorHandle:
        assert self.ring is not None and self._board is not None
        ctx = mp.get_context("spawn")
        free_recv, free_send = ctx.Pipe(duplex=False)
        filled_recv, filled_send = ctx.Pipe(duplex=False)
        spec = self._spec_of(index, self._workers, generation)
        process = ctx.Process(
            target=actor_process,
            name=f"fedrl-actor-{index}",
            kwargs={
                "spec": spec,
                "ring_name": self.ring.name,
                "ring_layout": self.ring.layout,
                "board_name": self._board.name,
                "board_layout": self._board.layout,
                "free_slots": free_recv,
                "filled_slots": filled_send,
            },
            daemon=True,
        )
        process.start()
        # The child has its own copies; closing ours lets EOF mean "gone".
        free_recv.close()
        filled_send.close()
        for slot in slots:
            if slot not in self._held:  # a held slot goes back when it is freed
                free_send.send_bytes(SLOT_FORMAT.pack(slot))
        return ActorHandle(
            spec, process, free_send, filled_recv, slots, restarts=restarts, generation=generation
        )


def describe_exit(code: int) -> str:
    """An exit code as people say it: "was killed by SIGKILL", "exited with code 1"."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
