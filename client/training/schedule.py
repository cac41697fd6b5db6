"""What the engine's two schedules share: the actor pool they collect with, and publishing.

A schedule decides how collection and learning take turns over one actor
pool (fedrl.client.training.actor_pool): off-policy (DQN,
fedrl.client.training.replay_schedule) or on-policy (PPO,
fedrl.client.training.rollout_schedule). It says which actors to start
(their specs, the slot layout, whether one actor runs in this process), and
`poll` runs one round of collecting and training; the engine
(fedrl.client.training.engine) drives rounds, counting, ranks and evaluation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from fedrl.client.training.actor_pool import ActorHandle, ActorPool, AnyActorSpec
from fedrl.client.training.counters import Tally
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.frame_slots import SlotLayout
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.opponent_pool import OpponentsSpec
from fedrl.client.training.shm import SlotFill


class Publishing(Protocol):
    """What a schedule needs of its learner to hand weights to the actors."""

    updates: int

    def weights(self) -> list[tuple[str, npt.NDArray[Any]]]: ...


L = TypeVar("L", bound=Publishing)


class Schedule(ABC, Generic[L]):
    """One algorithm's way of taking turns between its actors and its learner."""

    def __init__(
        self,
        learner: L,
        *,
        config: EngineConfig,
        network: NetworkConfig,
        seed_root: np.random.SeedSequence,
        tally: Tally,
    ) -> None:
        """`seed_root` spawns every actor's seed stream; `tally` counts what the actors collect."""
        self.learner = learner
        self.config = config
        """The engine's config; replaced (set_config) when hyperparameters change."""
        self._network = network
        self._seed_root = seed_root
        self._tally = tally
        self.pool = ActorPool(spec_of=self.actor_spec, max_restarts=config.max_actor_restarts)
        self.published_at = 0
        """The learner's update count when its weights last went to the actors."""
        self.opponents: OpponentsSpec | None = None
        """Two-player games: the league's board, which every actor's spec names."""

    # -- what each schedule says -------------------------------------------------

    @abstractmethod
    def in_process(self, workers: int) -> bool:
        """Whether `workers` means one actor in this process rather than actor processes."""

    @abstractmethod
    def actor_spec(self, index: int, num_actors: int, generation: int) -> AnyActorSpec:
        """Actor `index` of `num_actors` in its `generation`-th life, with the current config."""

    @abstractmethod
    def ring_layout(self, workers: int) -> SlotLayout:
        """The shared-memory slots `workers` actor processes fill (what start allocates)."""

    @property
    @abstractmethod
    def slots_per_actor(self) -> int:
        """Slots each actor process owns: how far its collection may run ahead."""

    @abstractmethod
    def ready(self) -> bool:
        """Whether this learner could train now (as one rank: its part of the ranks' readiness)."""

    @abstractmethod
    def poll(self, timeout_s: float, *, ranks_ready: bool | None) -> dict[str, float]:
        """One round of collecting and training; the training metrics, if it trained.

        `ranks_ready`: as one learner rank of several, whether every rank was
        ready at this round's exchange; None for a learner alone.
        """

    @abstractmethod
    def take_fill(self, actor: ActorHandle, fill: SlotFill) -> None:
        """Take in a slot `actor` announced as filled."""

    # -- shared ----------------------------------------------------------------------

    def start(self, workers: int) -> None:
        """Start the actors with the learner's current weights."""
        weights = self.learner.weights()
        if self.in_process(workers):
            self.pool.start_serial(weights, self.learner.updates)
            return
        self.pool.start_processes(
            self.ring_layout(workers),
            workers=workers,
            slots_per_actor=self.slots_per_actor,
            weights=weights,
        )

    def publish(self) -> None:
        """Hand the learner's weights to the actors."""
        self.pool.publish(self.learner.weights(), self.learner.updates)
        self.published_at = self.learner.updates

    def set_config(self, config: EngineConfig) -> None:
        """Take the engine's new config (new hyperparameters); actors restart separately."""
        self.config = config

    def check_actors(self) -> None:
        """Replace dead actors, taking in what they finished first (ActorPool.check)."""
        self.pool.check(self.take_fill)

    def restart_actors(self) -> None:
        """New actors with the current specs, holding the learner's current weights (on a
        ring laid out for the current config)."""
        actors = len(self.pool.actors)
        self.pool.restart(self.ring_layout(actors) if actors else None)
        self.publish()
