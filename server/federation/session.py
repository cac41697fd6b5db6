"""One session as the federation holds it, and the domain's requests and answers.

A Session is its spec, its in-memory counters and membership, its
aggregator (the single writer of its global model) and its files. The
dataclasses below are what the servicer (federation/service.py) turns
messages into and back: plain values, no gRPC.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.federation.aggregator import Aggregator, NamedTensors
from fedrl.server.refusals import PreconditionError
from fedrl.server.storage.model_store import ModelStore
from fedrl.server.storage.update_log import UpdateLog
from fedrl.server.strategy.strategy import Strategy
from fedrl.server.transport.request_fields import check_update_fields

FEDERATED, POPULATION = "federated", "pbt"
"""Session modes (JoinRequest.mode): averaging weight deltas, or population-based training."""


@dataclass(frozen=True)
class PushRequest:
    """The header of a push, as the domain sees it."""

    session: str
    participant_id: str
    sequence: int
    base_version: int
    env_steps: int
    episodes: int
    samples: int
    spec_hash: str
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Out-of-range numbers never make a request: nothing downstream must re-check them."""
        check_update_fields(
            sequence=self.sequence,
            samples=self.samples,
            episodes=self.episodes,
            env_steps=self.env_steps,
            base_version=self.base_version,
            metrics=self.metrics,
        )


@dataclass(frozen=True)
class PushResult:
    """The answer to a push; a duplicate gets the first answer again."""

    sequence: int
    duplicate: bool
    current_version: int
    staleness: int
    weight: float
    goal: pb.GoalState


@dataclass(frozen=True)
class JoinResult:
    session: str
    current_version: int
    goal: pb.GoalState
    last_update_sequence: int
    last_experience_sequence: int
    spec_hash: str


@dataclass(frozen=True)
class ModelView:
    """What PullModel streams: full tensors of `version`, or the delta from `from_version`."""

    session: str
    version: int
    from_version: int
    is_delta: bool
    spec_hash: str
    tensors: NamedTensors
    goal: pb.GoalState
    applied_sequence: int = 0
    """The requester's highest update sequence this version includes (0: none, or anonymous)."""


@dataclass
class Session:
    """One named session: its spec, its in-memory counters and its aggregator."""

    name: str
    spec: tpb.ModelSpec
    spec_hash: str
    goal_total: int
    episodes_done: int
    aggregator: Aggregator
    strategy: Strategy
    """The session's aggregation rule, the aggregator's own: admission, weight, combination."""
    store: ModelStore
    update_log: UpdateLog
    last_sequences: dict[str, int]
    participants: set[str]
    active: set[str]
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    append_floors: dict[object, int] = field(default_factory=dict)
    """For each push between its log append and the buffer: the log's last LSN before it."""
    in_flight: dict[tuple[str, int], asyncio.Future[PushResult]] = field(default_factory=dict)
    mode: str = FEDERATED
    """FEDERATED or POPULATION (server/population/), fixed by the first Join."""

    @property
    def goal(self) -> pb.GoalState:
        return goal_state(self.goal_total, self.episodes_done)

    def notify(self) -> None:
        """Wake every watcher; each waits on the event it saw, so none misses a change."""
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    def notice(self) -> pb.VersionNotice:
        return pb.VersionNotice(
            session=self.name,
            current_version=self.aggregator.current_version,
            goal=self.goal,
            active_participants=len(self.active),
            pushing_participants=self.aggregator.pushing_participants(),
        )

    def check_hash(self, claimed_hash: str) -> None:
        """Refuse a request made for another model than the session's."""
        if claimed_hash != self.spec_hash:
            raise PreconditionError(
                f"spec_hash {claimed_hash or '(empty)'} differs from the spec hash of session "
                f"{self.name!r} ({self.spec_hash}); Join again with the session's model"
            )

    def refuse_in_population(self, what: str) -> None:
        """Refuse a weight-averaging call in a population session."""
        if self.mode == POPULATION:
            raise PreconditionError(
                f"session {self.name!r} is a population (pbt): its members report their own "
                f"models (Population.Report) and never {what}"
            )


def goal_state(total: int, done: int) -> pb.GoalState:
    return pb.GoalState(total_episodes=total, episodes_done=done, reached=done >= total)


def described(mode: str) -> str:
    """A session mode for a message."""
    return "a population (pbt)" if mode == POPULATION else "federated (averaging)"
