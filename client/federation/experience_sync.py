"""Experience sync: the participant's recent transitions out, other participants' in.

Per sync (`ExperienceSync` holds these steps for the sync loop):

1. the training thread queues the transitions the learner took in since
   the last push (UnsentTransitions; the newest `push_transitions` of them
   if more arrived) in the durable outbox as kind "experience"
   (fedrl.client.federation.experience_client.queue_experience), so a crash
   or an outage loses nothing and the server's exactly-once key makes a
   resend harmless. No transition is pushed twice, so neither the server nor
   a foreign replay holds duplicates. Rows keep their arrival order, so each
   next_obs comes back a few rows later as an obs and the batch takes about
   half the bytes of a random sample (measured on CartPole: 16 against 31
   bytes per transition); frame stacks go in chains of each env's steps,
   each sharing three frames with the row before (Breakout: 42 bytes per
   transition of 56 KB raw, bench/atari_memory.py);
2. the network thread, in a task of its own on the server link (so a slow
   transfer never holds an update back), sends the queued entries and pulls
   up to `pull_transitions` of other participants' transitions after the
   cursor;
3. the training thread adds what was pulled to the learner's one replay,
   beside its own transitions, each earning replay-ratio credit like a local
   env step (TrainingEngine.add_foreign; the session's `foreign_credit`, or
   `round_foreign_credit` in rounds, fedrl.common.group_rules explains their
   defaults) up to this participant's own pace (PacedCredit, the session's
   `credit_at_own_pace`), then persists the
   cursor (fedrl.client.federation.experience_cursor): a crash before that
   pulls them again.

Why one replay with credit, not a separate foreign replay drawn at a fixed
share of each batch (the first design): a fixed share caps what others'
data can teach however much of it arrives, while updates that grow with
all the data received are Ape-X's recipe for a learner fed by many actors.
Measured in a lock-step simulation of the engine (CartPole, 8k env steps
per participant, mean greedy return over the run, 5 seeds): N = 2 sharing
experience only 221-251 with one replay against 202 with the fixed 25 %
share; with weight averaging too, 269 (10 seeds) against 205.

Experience sync needs no weight sync: no base version, no global model. A
participant that shares experience only (the sync loop's share
"experience") keeps training its own model.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import numpy as np

from fedrl.client.federation.errors import RejectedError
from fedrl.client.federation.experience_client import (
    KIND,
    ExperienceClient,
    Pulled,
    queue_experience,
)
from fedrl.client.federation.experience_cursor import CursorFile
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.observation_bounds import ObservationBounds
from fedrl.client.federation.outbox import Outbox
from fedrl.client.federation.outbox_file import Entry
from fedrl.client.federation.server_link import ServerLink
from fedrl.client.training.cnn import is_image
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.experience_conversion import to_experience, to_transitions
from fedrl.client.training.frame_replay import chain_order
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import observation_dtype
from fedrl.common.chunking import DEFAULT_CHUNK_BYTES
from fedrl.common.config_cli import doc
from fedrl.common.group_rules import GroupRules
from fedrl.envs.two_player import NO_OPPONENT
from fedrl.proto.v1 import federation_pb2 as fpb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExchangeConfig:
    """A participant's own experience exchange knobs: how much it pushes and pulls per sync.

    Local, unlike the credit the others' transitions earn, which is the
    session's rule (fedrl.common.group_rules: foreign_credit and its kin):
    what one member's link and memory take is its own business.
    """

    push_transitions: int = field(
        default=4096,
        metadata=doc(
            "Most transitions pushed to the session per sync: the newest of those collected "
            "since the last push, each pushed once (a batch waits for the previous one's "
            "acknowledgement, so this bounds what one push carries)."
        ),
    )
    pull_transitions: int = field(
        default=4096, metadata=doc("Other participants' transitions asked for per sync.")
    )

    def __post_init__(self) -> None:
        for name in ("push_transitions", "pull_transitions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


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
        obs_dtype = observation_dtype(self._obs_shape)
        self._columns: dict[str, np.ndarray] = {
            "obs": np.zeros((capacity, *obs_shape), dtype=obs_dtype),
            "action": np.zeros(capacity, dtype=np.int64),
            "reward": np.zeros(capacity, dtype=np.float32),
            "next_obs": np.zeros((capacity, *obs_shape), dtype=obs_dtype),
            "discount": np.zeros(capacity, dtype=np.float32),
            "opponent": np.zeros(capacity, dtype=np.int64),
        }
        self._capacity = capacity
        self._next = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, batch: LearnerTransitions) -> None:
        """Append a (validated) batch, overwriting the oldest unsent rows once full."""
        batch.validate(self._obs_shape, self._columns["obs"].dtype)
        skip = max(0, len(batch) - self._capacity)
        slots = (self._next + skip + np.arange(len(batch) - skip)) % self._capacity
        for name, column in self._columns.items():
            given = getattr(batch, name)
            column[slots] = NO_OPPONENT if given is None else given[skip:]
        self._next = int((self._next + len(batch)) % self._capacity)
        self._size = min(self._capacity, self._size + len(batch))

    def take(self) -> LearnerTransitions | None:
        """Every unsent row, now counted as sent; None if there is none.

        Rows come in arrival order; frame stacks in chains of each env's
        consecutive steps (frame_replay.chain_order), which compress and
        store best.
        """
        if self._size == 0:
            return None
        slots = (self._next - self._size + np.arange(self._size)) % self._capacity
        if is_image(self._obs_shape):
            slots = slots[chain_order(self._columns["obs"][slots])]
        self._size = 0
        c = self._columns
        opponent = c["opponent"][slots]
        return LearnerTransitions(
            obs=c["obs"][slots],
            action=c["action"][slots],
            reward=c["reward"][slots],
            next_obs=c["next_obs"][slots],
            discount=c["discount"][slots],
            opponent=opponent if (opponent != NO_OPPONENT).any() else None,
        )


class PacedCredit:
    """How many of each other participant's transitions earn replay-ratio credit.

    At most as many as this participant has collected itself since it
    started, per sender. Unbounded credit makes a pair's pace unstable: the
    slower member owes updates for more of the faster one's data per own env
    step, so it slows further, while the faster one receives less and speeds
    up (CartPole pairs with --foreign-credit 2: one member 26,000 updates and
    18,000 foreign transitions, the other 13,000 and 5,000). Per sender, so
    that N - 1 members at this one's pace all earn full credit. In memory:
    after a restart both counts start again from the cursor's next pull.
    """

    def __init__(self) -> None:
        self._own = 0
        self._credited: dict[str, int] = {}

    def collected(self, rows: int) -> None:
        """Count this participant's own transitions."""
        self._own += rows

    def grant(self, sender: str, rows: int) -> int:
        """How many of `rows` new transitions from `sender` earn credit (now counted)."""
        done = self._credited.get(sender, 0)
        granted = max(0, min(rows, self._own - done))
        self._credited[sender] = done + granted
        return granted


class ExperienceSync:
    """Experience exchange inside a sync loop, split by thread.

    Training thread: `record` every batch the learner takes in, `queue` at
    each sync, `adopt` at each round. Network thread: `exchange`, run by the
    server link (`attach`) after every join and whenever `send_soon` is
    called. At most one pulled result waits for adoption, so a slow learner
    bounds the memory pulls can take.
    """

    def __init__(
        self,
        config: ExchangeConfig,
        *,
        rules: GroupRules,
        obs_shape: tuple[int, ...],
        n_step: int,
        gamma: float,
        spec_hash: str,
        session: str,
        participant_id: str,
        cursor: CursorFile,
        pull: bool = True,
        bounds: ObservationBounds | None = None,
        opponent_name: Callable[[int], str] | None = None,
    ) -> None:
        """`rules`: the session's, whose credit the others' transitions earn (`follow`
        changes them). `pull=False` only pushes: a participant that acts and does not learn
        has no use for other participants' transitions. `bounds`: the session's observation
        bounds; rows outside them stay out of pushes (the server would refuse their whole
        batch). `opponent_name`: two-player games: the name of a league id, which a pushed
        batch records for each transition's opponent."""
        self._config = config
        self._rules = rules
        self._opponent_name = opponent_name
        self._pulls = pull
        self._bounds = bounds
        self.unshared_out_of_bounds = 0
        """Rows kept out of pushes because an observation left the session's bounds."""
        self._bounds_warned_at = 0
        self._unsent = UnsentTransitions(config.push_transitions, obs_shape)
        self._paced = PacedCredit() if rules.credit_at_own_pace else None
        self._n_step = n_step
        self._gamma = gamma
        self._spec_hash = spec_hash
        self._session = session
        self._participant_id = participant_id
        self._cursor_file = cursor
        self._cursor = cursor.load()
        self._lock = threading.Lock()
        self._pulled: Pulled | None = None
        self._pulls_started = 0
        self._last_pull_done = 0
        """Which pull (by start count, under _lock) finished last: a fresh one started after a
        request."""
        self._enabled = True
        self._link: ServerLink | None = None
        self._outbox: Outbox | None = None
        self._client: ExperienceClient | None = None
        self._rejoined = False
        self._wake: Callable[[], None] | None = None

    @property
    def enabled(self) -> bool:
        """False when the server has no experience service."""
        return self._enabled

    def attach(self, link: ServerLink, outbox: Outbox) -> None:
        """Exchange through the link: after every join, and whenever send_soon() is called."""
        self._link = link
        self._outbox = outbox
        self._wake = link.add_task(
            "experience exchange", self._exchange_on_link, on_join=self._joined
        )

    # Training thread.

    def follow(self, rules: GroupRules) -> None:
        """Credit the others' transitions by `rules` from now on (the session's, once known)."""
        self._rules = rules
        if not rules.credit_at_own_pace:
            self._paced = None
        elif self._paced is None:
            self._paced = PacedCredit()

    def record(self, batch: LearnerTransitions) -> None:
        if self._paced is not None:
            self._paced.collected(len(batch))
        if self._enabled:
            self._unsent.add(batch)

    def queue(self, outbox: Outbox, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Entry | None:
        """Queue the transitions recorded since the last push; None if there are none."""
        unsent = self._unsent.take() if self._enabled else None
        if unsent is not None and self._bounds is not None:
            unsent = self._within_bounds(unsent)
        if unsent is None:
            return None
        batch = to_experience(
            unsent,
            n_step=self._n_step,
            gamma=self._gamma,
            spec_hash=self._spec_hash,
            opponent_name=self._opponent_name,
        )
        return queue_experience(
            outbox,
            batch,
            session=self._session,
            participant_id=self._participant_id,
            chunk_bytes=chunk_bytes,
        )

    def _within_bounds(self, batch: LearnerTransitions) -> LearnerTransitions | None:
        assert self._bounds is not None
        keep = self._bounds.inside(batch)
        dropped = len(batch) - int(keep.sum())
        if not dropped:
            return batch
        before = self.unshared_out_of_bounds
        self.unshared_out_of_bounds += dropped
        # Said at the first such row and then each time the total doubles: visible, not a flood.
        if before == 0 or self.unshared_out_of_bounds >= 2 * self._bounds_warned_at:
            self._bounds_warned_at = self.unshared_out_of_bounds
            log.warning(
                "%d transitions so far had an observation outside the bounds the environment "
                "declares (its observation_space); they train this participant but are not "
                "shared, since the server would refuse the batch holding them",
                self.unshared_out_of_bounds,
            )
        return batch.rows(keep) if dropped < len(batch) else None

    def adopt(self, engine: TrainingEngine, *, in_rounds: bool = False) -> int:
        """Add the waiting pull to the engine's replay as foreign; the transitions added.
        `in_rounds`: the participant syncs in synchronous rounds, where the others' data earns
        `round_foreign_credit` instead of `foreign_credit`.

        A batch made with another gamma is skipped: its discounts gamma'**k
        would teach a different value function (another n is fine, each
        transition carries its own discount).
        """
        with self._lock:
            pulled, self._pulled = self._pulled, None
        if pulled is None:
            return 0
        added = 0
        rules = self._rules
        for header, batch in pulled.batches:
            if not math.isclose(batch.gamma, self._gamma, rel_tol=1e-6):
                log.warning(
                    "skipping %d foreign transitions made with gamma %g (ours is %g)",
                    len(batch),
                    batch.gamma,
                    self._gamma,
                )
                continue
            credit = rules.round_foreign_credit if in_rounds else rules.foreign_credit
            if self._paced is not None and len(batch):
                credit *= self._paced.grant(header.participant_id, len(batch)) / len(batch)
            engine.add_foreign(to_transitions(batch), credit=credit)
            added += len(batch)
        self._cursor_file.save(pulled.next_cursor)
        return added

    def in_flight(self) -> bool:
        """Whether a queued batch still waits for its acknowledgement (after attach)."""
        _, outbox = self._require_attached()
        return bool(self._enabled and outbox.pending(KIND))

    def send_soon(self) -> None:
        """Have the network thread send what is queued and pull (after attach)."""
        if self._wake is not None:
            self._wake()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued batch is acknowledged (after attach); False if time ran out."""
        link, outbox = self._require_attached()
        return link.wait_until(
            lambda: not (self._enabled and outbox.pending(KIND)),
            wake=self.send_soon,
            timeout_s=timeout_s,
        )

    def pull_fresh(self, timeout_s: float) -> bool:
        """Send what is queued, pull what the others pushed until now, and wait for both
        (after attach; the pull waits for adopt()); False if time ran out.

        A synchronous round calls it once the round's version is in: the
        others flushed their experience before pushing the updates that
        version holds, so the pull takes in all of the round's transitions.
        """
        link, _ = self._require_attached()
        if not (self._enabled and self._pulls):
            return True
        with self._lock:
            requested_after = self._pulls_started

        def pulled() -> bool:
            with self._lock:
                return self._last_pull_done > requested_after or not self._enabled

        return link.wait_until(pulled, wake=self.send_soon, timeout_s=timeout_s)

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
            if waiting or not self._pulls:
                return
            previous = self._cursor
            with self._lock:
                self._pulls_started += 1
                this_pull = self._pulls_started
            pulled = await client.pull(previous, self._config.pull_transitions)
        except RejectedError as exc:
            if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.warning("the server does not exchange experience (%s); exchange is off", exc)
            self._enabled = False
            return
        self._cursor = pulled.next_cursor
        with self._lock:
            # A moved cursor with no batches (only our own were new) is still worth keeping.
            if pulled.batches or pulled.next_cursor != previous:
                self._pulled = pulled
            self._last_pull_done = this_pull

    async def _joined(self, client: FederationClient, reply: fpb.JoinReply) -> None:
        _, outbox = self._require_attached()
        outbox.observe_acknowledged(KIND, reply.last_experience_sequence)

    async def _exchange_on_link(self) -> None:
        link, outbox = self._require_attached()
        if self._client is None:
            self._client = ExperienceClient(
                link.channel, participant_id=self._participant_id, session=self._session
            )
        try:
            await self.exchange(self._client, outbox)
        except RejectedError as exc:
            if (
                exc.code not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
                or self._rejoined
            ):
                raise
            # Not a member any more (e.g. a server restored from a backup):
            # join again once rather than stop training over experience.
            log.warning("experience exchange refused (%s); joining again", exc)
            self._rejoined = True
            await link.join()
            return
        self._rejoined = False

    def _require_attached(self) -> tuple[ServerLink, Outbox]:
        if self._link is None or self._outbox is None:
            raise RuntimeError("experience sync not attached: call attach() first")
        return self._link, self._outbox
