"""The participant's side of experience exchange: what to push, what to pull, how to mix it.

Per sync (`ExperienceSync` holds these steps for the sync loop):

1. the training thread queues the transitions the learner took in since
   the last push (UnsentTransitions; the newest `push_transitions` of them
   if more arrived) in the durable outbox as kind "experience"
   (`queue_experience`), so a crash or an outage loses nothing and the
   server's exactly-once key makes a resend harmless. No transition is
   pushed twice, so neither the server nor a foreign replay holds
   duplicates. Rows keep their arrival order, so each next_obs comes back a
   few rows later as an obs and the batch takes about half the bytes of a
   random sample (measured on CartPole: 16 against 31 bytes per transition);
2. the network thread sends outbox entries (`ExperienceClient.send_pending`)
   and pulls up to `pull_transitions` of other participants' transitions
   after the cursor (`ExperienceClient.pull`);
3. the training thread adds what was pulled to the replay as foreign, then
   persists the cursor (`CursorFile`): a crash before that pulls them again.

`MixedReplay` keeps foreign transitions apart from local ones and draws a
fixed share of every training batch from them: with one shared ring, a
participant pulling much would overwrite its own experience, and the share
would drift with how much each side had delivered lately. Build it with
`mixed_replay` and hand it to the Learner (its `replay` argument).

Foreign transitions must have been made with the local gamma: a discount
gamma'**k from another gamma would teach a different value function. A
different n is fine, since each transition carries its own discount.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import grpc
import numpy as np

from fedrl.client.federation.federation_client import (
    RejectedError,
    ServerCallError,
    Timeouts,
    UnavailableError,
)
from fedrl.client.federation.outbox import Entry, Outbox, OutboxError
from fedrl.client.training.learner import LearnerConfig
from fedrl.client.training.replay import PrioritizedReplay, SampledBatch
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.common.chunking import DEFAULT_CHUNK_BYTES, DecodeLimits
from fedrl.common.config_cli import doc
from fedrl.common.errors import DecodeError
from fedrl.common.experience import BatchAssembler, ExperienceBatch, batch_messages
from fedrl.common.identity import id_to_metadata, validate_participant_id
from fedrl.proto.v1 import experience_pb2 as pb
from fedrl.proto.v1 import experience_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb

log = logging.getLogger(__name__)

KIND = "experience"
"""The outbox kind of experience batches."""

_DEFAULT_TIMEOUTS = Timeouts()
# One pulled batch: one block of columns, at most the server's batch bound (64 MiB) decoded.
_DEFAULT_LIMITS = DecodeLimits(max_tensors=1, max_total_raw_bytes=64 << 20)

# Statuses where sending the same batch again cannot help.
_REFUSED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        # A server without the experience service: exchange is off there.
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


@dataclass(frozen=True)
class ExchangeConfig:
    """Experience exchange knobs of a participant."""

    foreign_share: float = field(
        default=0.25,
        metadata=doc(
            "Share of each training batch drawn from other participants' transitions; 0 turns "
            "experience exchange off."
        ),
    )
    push_transitions: int = field(
        default=1024,
        metadata=doc(
            "Most transitions pushed to the session per sync: the newest of those collected "
            "since the last push, each pushed once."
        ),
    )
    pull_transitions: int = field(
        default=4096, metadata=doc("Other participants' transitions asked for per sync.")
    )
    foreign_capacity: int = field(
        default=50_000,
        metadata=doc("Foreign transitions the replay keeps, apart from the local ones."),
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.foreign_share < 1.0:
            raise ValueError(
                f"foreign_share must lie in [0, 1): a learner needs some of its own data, "
                f"got {self.foreign_share}"
            )
        for name in ("push_transitions", "pull_transitions", "foreign_capacity"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def enabled(self) -> bool:
        return self.foreign_share > 0.0


# Conversions between the learner's columns and the wire's.


def to_experience(
    batch: LearnerTransitions, *, n_step: int, gamma: float, spec_hash: str
) -> ExperienceBatch:
    """A local batch as an ExperienceBatch.

    A LearnerTransitions folds termination into its discount (0.0) and does not
    keep truncation, which bootstraps like an ongoing episode; so terminated
    is discount == 0 and truncated is False.
    """
    terminated = batch.discount == 0.0
    return ExperienceBatch(
        obs=batch.obs,
        action=batch.action,
        reward=batch.reward,
        next_obs=batch.next_obs,
        discount=batch.discount,
        terminated=terminated,
        truncated=np.zeros_like(terminated),
        n_step=n_step,
        gamma=gamma,
        env_spec_hash=spec_hash,
    )


def to_transitions(batch: ExperienceBatch) -> LearnerTransitions:
    """A pulled batch as learner columns (float32 observations, int64 actions)."""
    return LearnerTransitions(
        obs=batch.obs.astype(np.float32, copy=False),
        action=batch.action.astype(np.int64, copy=False),
        reward=batch.reward.astype(np.float32, copy=False),
        next_obs=batch.next_obs.astype(np.float32, copy=False),
        # Terminated rows bootstrap from nothing, whatever the sender wrote.
        discount=np.where(batch.terminated, 0.0, batch.discount).astype(np.float32),
    )


class UnsentTransitions:
    """The newest transitions the learner took in since the last push, at most `capacity`.

    A ring of preallocated columns: older unsent rows are overwritten, since
    a push takes at most `capacity` rows anyway. Not thread-safe (the
    training thread owns it). In memory only: rows recorded but not yet
    queued when the process dies are simply not shared; what was queued is
    in the outbox and goes out exactly once.
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...]) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._obs_shape = tuple(obs_shape)
        self._columns: dict[str, np.ndarray] = {
            "obs": np.zeros((capacity, *obs_shape), dtype=np.float32),
            "action": np.zeros(capacity, dtype=np.int64),
            "reward": np.zeros(capacity, dtype=np.float32),
            "next_obs": np.zeros((capacity, *obs_shape), dtype=np.float32),
            "discount": np.zeros(capacity, dtype=np.float32),
        }
        self._capacity = capacity
        self._next = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, batch: LearnerTransitions) -> None:
        """Append a (validated) batch, overwriting the oldest unsent rows once full."""
        batch.validate(self._obs_shape)
        skip = max(0, len(batch) - self._capacity)
        slots = (self._next + skip + np.arange(len(batch) - skip)) % self._capacity
        for name, column in self._columns.items():
            column[slots] = getattr(batch, name)[skip:]
        self._next = int((self._next + len(batch)) % self._capacity)
        self._size = min(self._capacity, self._size + len(batch))

    def take(self) -> LearnerTransitions | None:
        """Every unsent row in arrival order, now counted as sent; None if there is none."""
        if self._size == 0:
            return None
        slots = (self._next - self._size + np.arange(self._size)) % self._capacity
        self._size = 0
        return LearnerTransitions(**{name: column[slots] for name, column in self._columns.items()})


# The durable outbox.


def queue_experience(
    outbox: Outbox,
    batch: ExperienceBatch,
    *,
    session: str,
    participant_id: str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Entry:
    """Write a batch to the outbox under the next experience sequence, before any send."""

    def build(sequence: int) -> list[bytes]:
        messages = batch_messages(
            batch,
            session=session,
            participant_id=participant_id,
            sequence=sequence,
            chunk_bytes=chunk_bytes,
        )
        return [message.SerializeToString() for message in messages]

    return outbox.add(KIND, build)


def experience_messages(entry: Entry) -> list[pb.ExperienceChunk]:
    """An experience entry's messages, parsed for sending."""
    if entry.kind != KIND:
        raise OutboxError(f"entry {entry.sequence} is a {entry.kind!r}, not {KIND!r}")
    messages = [pb.ExperienceChunk.FromString(m) for m in entry.messages]
    if not messages or not messages[0].HasField("header"):
        raise OutboxError(f"experience entry {entry.sequence} does not start with its header")
    return messages


# The service.


@dataclass(frozen=True)
class Pulled:
    """What one pull brought: other participants' batches and where the next pull starts."""

    batches: list[tuple[pb.ExperienceHeader, ExperienceBatch]]
    next_cursor: int

    @property
    def transitions(self) -> int:
        return sum(len(batch) for _, batch in self.batches)


class ExperienceClient:
    """Calls of the ExperienceExchange service for one participant in one session.

    The channel belongs to the caller, as for FederationClient. Errors are
    the same two kinds: UnavailableError (try again later) and RejectedError.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        participant_id: str,
        session: str,
        timeouts: Timeouts = _DEFAULT_TIMEOUTS,
        limits: DecodeLimits = _DEFAULT_LIMITS,
    ) -> None:
        # The generated gRPC module has no type stubs.
        self._stub = pb_grpc.ExperienceExchangeStub(channel)  # type: ignore[no-untyped-call]
        self.participant_id = validate_participant_id(participant_id)
        self.session = session
        self._metadata = (id_to_metadata(self.participant_id),)
        self._timeouts = timeouts
        self._limits = limits

    async def push(self, messages: Sequence[pb.ExperienceChunk]) -> pb.PushExperienceReply:
        """Send batches built by queue_experience; the reply means they are durable."""
        sequences = [m.header.sequence for m in messages if m.HasField("header")]
        what = f"push of experience {sequences}"
        try:
            reply = cast(
                pb.PushExperienceReply,
                await self._stub.PushExperience(
                    _aiter(messages), metadata=self._metadata, timeout=self._timeouts.transfer_s
                ),
            )
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, what) from None
        acked = [ack.sequence for ack in reply.acks]
        if acked != sequences:
            # An ack for another sequence would delete the wrong outbox entry.
            raise RejectedError(f"{what}: the server acknowledged {acked}")
        return reply

    async def send_pending(self, outbox: Outbox) -> int:
        """Send the outbox's experience entries oldest first; returns how many were acknowledged.

        A refused entry is moved aside by the outbox (kept for a human) and
        the rest go on; an outage raises UnavailableError, a server without
        the service RejectedError (UNIMPLEMENTED), both leaving the entry queued.
        """
        sent = 0
        while (entry := outbox.next_to_send(KIND)) is not None:
            try:
                await self.push(experience_messages(entry))
            except RejectedError as exc:
                if exc.code == grpc.StatusCode.UNIMPLEMENTED:
                    # Not the batch's fault: keep it for a server that has the service.
                    raise
                outbox.reject(KIND, entry.sequence, str(exc))
                continue
            outbox.acknowledge(KIND, entry.sequence)
            sent += 1
        return sent

    async def pull(self, cursor: int, max_transitions: int) -> Pulled:
        """Other participants' batches after cursor, up to max_transitions."""
        request = pb.PullExperienceRequest(
            session=self.session,
            participant_id=self.participant_id,
            cursor=cursor,
            max_transitions=max_transitions,
            codec=tpb.CODEC_ZSTD,
        )
        what = "pull of experience"
        try:
            call = self._stub.PullExperience(
                request, metadata=self._metadata, timeout=self._timeouts.transfer_s
            )
            return await self._assemble(call)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc, what) from None
        except DecodeError as exc:
            # Nothing was kept and the cursor did not move: asking again is safe.
            raise UnavailableError(f"{what}: {exc}") from None

    async def _assemble(self, call: AsyncIterator[pb.ExperienceChunk]) -> Pulled:
        batches: list[tuple[pb.ExperienceHeader, ExperienceBatch]] = []
        header: pb.ExperienceHeader | None = None
        assembler: BatchAssembler | None = None
        async for message in call:
            if message.HasField("header"):
                if assembler is not None:
                    raise DecodeError("a batch header arrived inside another batch")
                header = message.header
                assembler = BatchAssembler(header, self._limits)
            elif message.HasField("chunk"):
                if assembler is None or header is None:
                    raise DecodeError("a chunk arrived before its batch header")
                assembler.add(message.chunk)
                if assembler.complete:
                    batches.append((header, assembler.result()))
                    assembler = None
            elif message.HasField("end"):
                if assembler is not None:
                    raise DecodeError("the pull ended inside a batch")
                return Pulled(batches, message.end.next_cursor)
        raise DecodeError("the pull stream ended without its end message")


def _translate(exc: grpc.aio.AioRpcError, what: str) -> ServerCallError:
    code = exc.code()
    message = f"{what}: {exc.details() or code.name}"
    if code in _REFUSED:
        return RejectedError(message, code)
    return UnavailableError(message, code)


async def _aiter(items: Iterable[pb.ExperienceChunk]) -> AsyncIterator[pb.ExperienceChunk]:
    for item in items:
        yield item


# The persisted cursor.


class CursorFile:
    """Where the next pull starts, per session, kept across restarts.

    Losing it costs only duplicates of foreign transitions already seen (the
    server starts over from its oldest batch), so a damaged file is reported
    and read as 0 rather than stopping the participant.
    """

    def __init__(self, path: Path) -> None:
        self._path = path

    def load(self) -> int:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            cursor = data["cursor"]
            if not isinstance(cursor, int) or cursor < 0:
                raise ValueError(f"cursor {cursor!r} is not a non-negative integer")
        except FileNotFoundError:
            return 0
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("experience cursor %s is unreadable (%s); starting from 0", self._path, exc)
            return 0
        return cursor

    def save(self, cursor: int) -> None:
        """Replace the file atomically: a crash leaves the old cursor or the new one."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self._path.parent, prefix=f".{self._path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"cursor": cursor}, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self._path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


# Mixing foreign transitions into training batches.


class MixedReplay:
    """Local and foreign transitions in two replays; each draw takes a fixed foreign share.

    The same interface as PrioritizedReplay (add, sample, update_priorities,
    len), so the learner need not know. Slots of the foreign replay are
    numbered after the local capacity, so priorities find their way back.
    Importance weights are those of each replay; both are at most 1.
    """

    def __init__(
        self,
        local: PrioritizedReplay,
        foreign: PrioritizedReplay,
        *,
        foreign_share: float,
        gamma: float,
    ) -> None:
        if not 0.0 <= foreign_share < 1.0:
            raise ValueError(f"foreign_share must lie in [0, 1), got {foreign_share}")
        if local.obs_shape != foreign.obs_shape:
            raise ValueError("local and foreign replays must hold the same observation shape")
        self.local = local
        self.foreign = foreign
        self.foreign_share = foreign_share
        self.gamma = gamma
        self.obs_shape = local.obs_shape

    def __len__(self) -> int:
        return len(self.local) + len(self.foreign)

    def add(self, batch: LearnerTransitions, *, foreign: bool = False) -> None:
        (self.foreign if foreign else self.local).add(batch)

    def add_pulled(self, batch: ExperienceBatch) -> bool:
        """Add a pulled batch as foreign, unless it was made with another gamma."""
        if not math.isclose(batch.gamma, self.gamma, rel_tol=1e-6):
            log.warning(
                "skipping %d foreign transitions made with gamma %g (ours is %g)",
                len(batch),
                batch.gamma,
                self.gamma,
            )
            return False
        self.foreign.add(to_transitions(batch))
        return True

    def sample(self, batch_size: int, beta: float) -> SampledBatch:
        """Draw batch_size transitions, round(share * batch_size) of them foreign when any exist.

        Local rows come first, foreign last; the learner splits a block by
        striding, so each update's batch gets the share to within one row.
        """
        foreign = round(self.foreign_share * batch_size) if len(self.foreign) else 0
        if len(self.local) == 0:
            foreign = batch_size
        parts = []
        if batch_size - foreign:
            parts.append((self.local.sample(batch_size - foreign, beta), 0, False))
        if foreign:
            parts.append((self.foreign.sample(foreign, beta), self.local.capacity, True))
        return SampledBatch(
            batch=LearnerTransitions.concat([part.batch for part, _, _ in parts]),
            indices=np.concatenate([part.indices + offset for part, offset, _ in parts]),
            weights=np.concatenate([part.weights for part, _, _ in parts]),
            foreign=np.concatenate([np.full(len(part.indices), flag) for part, _, flag in parts]),
        )

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        indices = np.asarray(indices)
        td_abs = np.asarray(td_abs)
        is_foreign = indices >= self.local.capacity
        self.local.update_priorities(indices[~is_foreign], td_abs[~is_foreign])
        self.foreign.update_priorities(
            indices[is_foreign] - self.local.capacity, td_abs[is_foreign]
        )


def mixed_replay(
    learner: LearnerConfig, obs_shape: tuple[int, ...], exchange: ExchangeConfig
) -> MixedReplay:
    """The replay for a Learner that exchanges experience: local as configured, foreign apart."""

    def replay(capacity: int, seed: int) -> PrioritizedReplay:
        return PrioritizedReplay(
            capacity,
            obs_shape,
            prioritized=learner.prioritized,
            alpha=learner.alpha,
            eps=learner.priority_eps,
            seed=seed,
        )

    return MixedReplay(
        replay(learner.replay_capacity, learner.seed),
        # Its own seed: the two replays must not draw the same slot sequence.
        replay(exchange.foreign_capacity, learner.seed + 1),
        foreign_share=exchange.foreign_share,
        gamma=learner.gamma,
    )


class ExperienceSync:
    """Experience exchange inside a sync loop, split by thread.

    Training thread: `record` every batch the learner takes in, `queue` at
    each sync, `adopt` at each round. Network thread: `exchange` at each
    contact with the server. At most one pulled result waits for adoption,
    so a slow learner bounds the memory pulls can take.
    """

    def __init__(
        self,
        config: ExchangeConfig,
        *,
        obs_shape: tuple[int, ...],
        n_step: int,
        gamma: float,
        spec_hash: str,
        session: str,
        participant_id: str,
        cursor: CursorFile,
    ) -> None:
        self._config = config
        self._unsent = UnsentTransitions(config.push_transitions, obs_shape)
        self._n_step = n_step
        self._gamma = gamma
        self._spec_hash = spec_hash
        self._session = session
        self._participant_id = participant_id
        self._cursor_file = cursor
        self._cursor = cursor.load()
        self._lock = threading.Lock()
        self._pulled: Pulled | None = None
        self._enabled = config.enabled

    @property
    def enabled(self) -> bool:
        """False when the share is 0 or the server has no experience service."""
        return self._enabled

    # Training thread.

    def record(self, batch: LearnerTransitions) -> None:
        if self._enabled:
            self._unsent.add(batch)

    def queue(self, outbox: Outbox, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Entry | None:
        """Queue the transitions recorded since the last push; None if there are none."""
        unsent = self._unsent.take() if self._enabled else None
        if unsent is None:
            return None
        batch = to_experience(
            unsent, n_step=self._n_step, gamma=self._gamma, spec_hash=self._spec_hash
        )
        return queue_experience(
            outbox,
            batch,
            session=self._session,
            participant_id=self._participant_id,
            chunk_bytes=chunk_bytes,
        )

    def adopt(self, replay: MixedReplay) -> int:
        """Add the waiting pull to the replay as foreign; returns the transitions added."""
        with self._lock:
            pulled, self._pulled = self._pulled, None
        if pulled is None:
            return 0
        added = sum(len(batch) for _, batch in pulled.batches if replay.add_pulled(batch))
        self._cursor_file.save(pulled.next_cursor)
        return added

    # Network thread.

    async def exchange(self, client: ExperienceClient, outbox: Outbox) -> None:
        """Send queued batches, then pull once if the last pull was adopted.

        UnavailableError passes to the caller (retry with backoff); a server
        without the service turns exchange off for this run, with a warning.
        """
        if not self._enabled:
            return
        try:
            await client.send_pending(outbox)
            with self._lock:
                waiting = self._pulled is not None
            if waiting:
                return
            previous = self._cursor
            pulled = await client.pull(previous, self._config.pull_transitions)
        except RejectedError as exc:
            if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.warning("the server does not exchange experience (%s); exchange is off", exc)
            self._enabled = False
            return
        self._cursor = pulled.next_cursor
        # A moved cursor with no batches (only our own were new) is still worth keeping.
        if pulled.batches or pulled.next_cursor != previous:
            with self._lock:
                self._pulled = pulled
