"""Sessions and the federation's domain rules: join, seed, push, pull, goal.

Plain asyncio classes with no gRPC in them: the servicer (server/service.py)
translates messages to these calls and the refusals they raise
(server/refusals.py) to status codes, so every rule here is reachable from a
unit test without a network.

A push is acknowledged in this order: checks (session, spec, sequence,
staleness, tensors) -> update log append (durable) -> ack row with the answer
and the counters (durable) -> queued for the aggregator -> answer. A crash
between the log and the ack row is repaired at start: every logged update
past the newest version gets its ack row (INSERT OR IGNORE) and goes back into
the buffer, so the client's retry meets a stored answer.

SQLite is used from one dedicated thread (DbRunner), so calls never
interleave inside a transaction and the event loop never waits on an fsync.
Ack rows of concurrent pushes share a transaction (AckBatcher), as their log
records share an fdatasync (UpdateLog): under load a push waits for one
disk flush of each kind, not for every other push's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedrl.common.durable_files import remove_abandoned_temp_files
from fedrl.common.identity import safe_dirname, validate_participant_id
from fedrl.common.spec import spec_difference, spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server import quarantine
from fedrl.server.aggregation import Strategy, make_strategy, update_weight
from fedrl.server.aggregator import (
    Aggregator,
    AggregatorSettings,
    AlreadySeededError,
    NamedTensors,
    Snapshot,
)
from fedrl.server.config import ServerConfig
from fedrl.server.model_store import ModelStore
from fedrl.server.norm_bound import NormBound, l2_norm
from fedrl.server.refusals import (
    AlreadyExistsError,
    InvalidRequestError,
    LimitExceededError,
    NotFoundError,
    PreconditionError,
    RequestRefusedError,
)
from fedrl.server.request_fields import check_update_fields
from fedrl.server.state_db import (
    AckBatcher,
    AckRow,
    DbRunner,
    SessionRow,
    StateDB,
    goal_state,
    write_json_atomically,
)
from fedrl.server.update_log import LoggedUpdate, UnreadableRecord, UpdateLog, record_payload
from fedrl.server.version_events import VersionEvents

log = logging.getLogger(__name__)

DB_FILE = "state.sqlite3"
GLOBAL_STATE_FILE = "global_state.json"
GLOBAL_STATE_MIN_INTERVAL_S = 1.0
"""Shortest time between two rewrites of global_state.json while changes keep coming."""
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
"""Under the data dir: one TensorBoard run per session (with --tensorboard)."""
SESSIONS_DIR = "sessions"
DEFAULT_SESSION = "default"
ACCEPTED_DELTA_DTYPES = (tpb.DTYPE_FLOAT32, tpb.DTYPE_FLOAT16, tpb.DTYPE_BFLOAT16)
MAX_DIMS = 32
MAX_DATA_SOURCE_CHARS = 1_000
"""A data source is a URL and a table or query name: a line, never a document."""
"""Dimensions a spec's tensor or observation space may have: more than any network uses, and
few enough that sizes and messages stay small (a Join naming 5,000 dimensions of 2^62 each
made the size's decimal form too long for Python to print, answering UNKNOWN)."""
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
    store: ModelStore
    update_log: UpdateLog
    last_sequences: dict[str, int]
    participants: set[str]
    active: set[str]
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    append_floors: dict[object, int] = field(default_factory=dict)
    """For each push between its log append and the buffer: the log's last LSN before it."""
    in_flight: dict[tuple[str, int], asyncio.Future[PushResult]] = field(default_factory=dict)
    norm_bound: NormBound = field(default_factory=lambda: NormBound(factor=0.0))
    mode: str = FEDERATED
    """FEDERATED or POPULATION (server/population.py), fixed by the first Join."""

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


class Federation:
    """All sessions of one server; the domain behind the Federation service."""

    def __init__(
        self,
        config: ServerConfig,
        db: DbRunner,
        *,
        strategy: Callable[[], Strategy] | None = None,
    ) -> None:
        self.config = config
        self._db = db
        self._acks = AckBatcher(db)
        self._global_state_dirty = False
        self._global_state_writer: asyncio.Task[None] | None = None
        # Each session's aggregator gets its own strategy object: the injected
        # factory's, or the one the config names for that session.
        self._injected_strategy = strategy
        self._sessions: dict[str, Session] = {}
        self._create_lock = asyncio.Lock()
        self.closing = asyncio.Event()
        self._version_events = (
            VersionEvents(config.data_dir / TENSORBOARD_DIR) if config.tensorboard else None
        )

    # Start and stop.

    @classmethod
    async def open(
        cls, config: ServerConfig, *, strategy: Callable[[], Strategy] | None = None
    ) -> Federation:
        """Open the data dir and recover every session to its last committed version.

        `strategy` makes the aggregation strategy of each session, replacing
        the one config.strategy names (e.g. a custom robust aggregator).
        """
        config.data_dir.mkdir(parents=True, exist_ok=True)
        # What a crash in the middle of a rewrite of global_state.json left.
        remove_abandoned_temp_files(config.data_dir, re.compile(re.escape(GLOBAL_STATE_FILE)))
        runner = DbRunner(await asyncio.to_thread(StateDB, config.data_dir / DB_FILE))
        federation = cls(config, runner, strategy=strategy)
        await runner(lambda db: db.save_session_config(federation.session_config()))
        for row in await runner(lambda db: db.sessions()):
            await federation._recover(row)
        await federation._write_global_state()
        return federation

    async def close(self) -> None:
        """Fold buffered updates into a last version, then release files and the database."""
        self.closing.set()
        for session in self._sessions.values():
            await session.aggregator.close()
            session.update_log.close()
            session.notify()
        if self._version_events is not None:
            self._version_events.close()
        if self._global_state_writer is not None:
            # The final write below covers whatever it would have written.
            self._global_state_writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._global_state_writer
        await self._write_global_state()
        await asyncio.to_thread(self._db.close)

    @property
    def db(self) -> DbRunner:
        """The state database's runner, shared with the population (server/population.py)."""
        return self._db

    def population_changed(self, session: Session) -> None:
        """A population's members or goal moved: wake watchers, refresh global_state.json."""
        session.notify()
        self._global_state_changed()

    def session_config(self, session_name: str | None = None) -> pb.SessionConfig:
        """The settings clients follow; with a session name, that session's strategy."""
        c = self.config
        return pb.SessionConfig(
            max_staleness=c.max_staleness,
            buffer_size=c.buffer_size,
            chunk_bytes=c.chunk_bytes,
            max_message_bytes=c.max_message_bytes,
            strategy=c.strategy if session_name is None else c.strategy_for(session_name),
            server_learning_rate=c.server_lr,
            sync_interval=c.sync_interval,
            delta_dtypes=list(ACCEPTED_DELTA_DTYPES),
            global_eval_interval=c.global_eval_interval,
            push_rate_per_s=c.push_rate_per_s,
            pbt_ready_steps=c.pbt_ready_steps,
            pbt_quantile=c.pbt_quantile,
            pbt_resample_probability=c.pbt_resample_probability,
        )

    # Join and leave.

    async def join(
        self,
        session_name: str,
        participant_id: str,
        spec: tpb.ModelSpec,
        claimed_hash: str,
        mode: str = "",
        *,
        data: tuple[str, bool] = ("", False),
    ) -> JoinResult:
        """`data`: what the participant trains on (source, synthetic), for status."""
        name = validate_session_name(session_name)
        pid = validate_id(participant_id)
        source, synthetic = data
        if len(source) > MAX_DATA_SOURCE_CHARS:
            raise InvalidRequestError(
                f"data_source has {len(source)} characters; at most {MAX_DATA_SOURCE_CHARS}"
            )
        mode = mode or FEDERATED
        if mode not in (FEDERATED, POPULATION):
            raise InvalidRequestError(
                f"mode {mode!r} is not a session mode: {FEDERATED} or {POPULATION}"
            )
        digest = spec_hash(spec)
        if claimed_hash and claimed_hash != digest:
            raise InvalidRequestError(
                f"spec_hash {claimed_hash} does not match the spec sent (its hash is {digest})"
            )
        check_spec(spec, max_model_bytes=self.config.max_model_bytes)
        async with self._create_lock:
            session = self._sessions.get(name)
            if session is None:
                session = await self._create(name, spec, digest, mode)
        if session.mode != mode:
            raise PreconditionError(
                f"session {name!r} is {_described(session.mode)}, you asked for "
                f"{_described(mode)}: join it with --mode {session.mode}, or use another --session"
            )
        if session.spec_hash != digest:
            difference = spec_difference(session.spec, spec) or "canonical form"
            raise PreconditionError(
                f"model spec differs from session {name!r}: {difference}; "
                "use a matching model or another --session"
            )
        now = now_ms()
        await self._db(lambda db: db.touch_participant(name, pid, "active", now))
        await self._db(lambda db: db.set_participant_data(name, pid, source, synthetic))
        experience_sequence = await self._db(lambda db: db.last_experience_sequence(name, pid))
        session.participants.add(pid)
        session.active.add(pid)
        session.notify()
        self._global_state_changed()
        return JoinResult(
            session=name,
            current_version=session.aggregator.current_version,
            goal=session.goal,
            last_update_sequence=session.last_sequences.get(pid, 0),
            last_experience_sequence=experience_sequence,
            spec_hash=digest,
        )

    async def leave(self, session_name: str, participant_id: str) -> None:
        session = self.session(session_name)
        pid = self._member(session, participant_id)
        now = now_ms()
        await self._db(lambda db: db.touch_participant(session.name, pid, "left", now))
        session.active.discard(pid)
        session.aggregator.forget(pid)
        session.notify()
        self._global_state_changed()

    # Seed.

    async def seed(
        self, session_name: str, participant_id: str, claimed_hash: str, tensors: NamedTensors
    ) -> int:
        session = self.session(session_name)
        pid = self._member(session, participant_id)
        self._check_hash(session, claimed_hash)
        _refuse_in_population(session, "seed a global model")
        checked = check_tensors(session.spec, tensors, what="seed model")
        try:
            version = await session.aggregator.seed(pid, checked)
        except AlreadySeededError as exc:
            raise AlreadyExistsError(str(exc)) from None
        return version

    # Push: the header first (duplicates answer without reading the tensors), then the body.

    async def check_push(self, request: PushRequest) -> PushResult | None:
        """The stored answer for a repeated push, None for a new one; raises if it is refused."""
        session = self.session(request.session)
        pid = self._member(session, request.participant_id)
        self._check_hash(session, request.spec_hash)
        _refuse_in_population(session, "push weight deltas")
        # Its numbers were range-checked when it was made (PushRequest.__post_init__).
        pending = session.in_flight.get((pid, request.sequence))
        if pending is not None:
            # A twin still on its way: its answer, counted like any repeated push.
            answer = _as_duplicate(await asyncio.shield(pending))
            await self._count_duplicate(session, pid)
            return answer
        if request.sequence <= session.last_sequences.get(pid, 0):
            return await self._stored_answer(session, pid, request.sequence)
        if session.aggregator.current_version < 0:
            raise PreconditionError(
                f"session {session.name!r} has no model yet: call SeedModel first"
            )
        try:
            self._staleness(session, request.base_version)
        except RequestRefusedError:
            await self.count_rejection(session.name, pid)
            raise
        return None

    async def push(self, request: PushRequest, tensors: NamedTensors) -> PushResult:
        """Acknowledge a new update once it is durable; a concurrent twin waits for its answer."""
        session = self.session(request.session)
        pid = self._member(session, request.participant_id)
        key = (pid, request.sequence)
        known = await self.check_push(request)
        if known is not None:
            return known
        done: asyncio.Future[PushResult] = asyncio.get_running_loop().create_future()
        session.in_flight[key] = done
        try:
            await session.aggregator.wait_for_room(self.config.max_pending)
            result = await self._accept(session, pid, request, tensors)
        except BaseException as exc:
            done.set_exception(exc)
            # Nobody else may be waiting; mark the exception seen.
            done.exception()
            raise
        finally:
            del session.in_flight[key]
        done.set_result(result)
        return result

    async def count_rejection(self, session_name: str, participant_id: str) -> None:
        """Count a refused update against its participant, where both are known."""
        try:
            session = self.session(session_name)
        except RequestRefusedError:
            return
        if participant_id not in session.participants:
            return
        now = now_ms()
        await self._db(lambda db: db.count_rejection(session.name, participant_id, now))

    async def _accept(
        self, session: Session, pid: str, request: PushRequest, tensors: NamedTensors
    ) -> PushResult:
        try:
            # A pass or two over every value: off the event loop, like the decoding.
            checked, norm = await asyncio.to_thread(
                check_update, session.spec, tensors, max_norm=self.config.max_update_norm
            )
            snapshot = session.aggregator.snapshot
            if snapshot is not None:
                session.norm_bound.check(norm, version=snapshot.version, model=snapshot.tensors)
            staleness = self._staleness(session, request.base_version)
        except RequestRefusedError:
            await self.count_rejection(session.name, pid)
            raise
        weight = update_weight(
            request.samples,
            staleness,
            max_samples=self.config.max_samples,
            exponent=self.config.staleness_exponent,
        )
        append = functools.partial(
            session.update_log.append,
            session=session.name,
            participant_id=pid,
            sequence=request.sequence,
            base_version=request.base_version,
            samples=request.samples,
            env_steps=request.env_steps,
            episodes=request.episodes,
            weight=weight,
            staleness=staleness,
            metrics=dict(request.metrics),
            tensors=checked,
            received_unix_ms=now_ms(),
        )
        # Shielded: a client that hangs up must not stop an update between
        # the log and the buffer, or it would be acknowledged but not applied.
        return await asyncio.shield(
            self._log_and_queue(session, pid, request.sequence, append, norm)
        )

    async def _log_and_queue(
        self,
        session: Session,
        pid: str,
        sequence: int,
        append: Callable[[], LoggedUpdate],
        norm: float,
    ) -> PushResult:
        # Until this update is in the buffer, the log must keep every record
        # above the LSN it had before the append (see discard_watermark).
        token = object()
        session.append_floors[token] = session.update_log.last_lsn
        try:
            logged = await asyncio.to_thread(append)
            stored = await self._acknowledge(session, logged)
            if stored is None:
                # Acknowledged before, through another record: answer as then.
                return await self._stored_answer(session, pid, sequence)
            session.aggregator.submit(logged)
            session.norm_bound.accepted(norm)
        finally:
            del session.append_floors[token]
        return _result_from_ack(stored, duplicate=False)

    async def _acknowledge(self, session: Session, update: LoggedUpdate) -> AckRow | None:
        """Store the ack row and move the counters; None if this push was acknowledged before.

        Also used at recovery, for updates logged but never acknowledged.
        """
        ack = AckRow(
            session=session.name,
            participant_id=update.participant_id,
            sequence=update.sequence,
            lsn=update.lsn,
            base_version=update.base_version,
            current_version=update.acked_version,
            staleness=update.staleness,
            weight=update.weight,
            episodes=update.episodes,
            env_steps=update.env_steps,
            # Filled in by StateDB.record_acks from the session's totals.
            goal_total=0,
            goal_done=0,
            received_ms=update.received_unix_ms,
            eval_return=update.metrics.get("eval_return"),
            base_eval_return=update.metrics.get("base_eval_return"),
            evaluated_version=(
                int(update.metrics["evaluated_version"])
                if "evaluated_version" in update.metrics
                else None
            ),
        )
        stored = await self._acks.record(ack)
        if stored is None:
            return None
        # Completions may arrive out of order; the database's totals only grow.
        session.episodes_done = max(session.episodes_done, stored.goal_done)
        session.last_sequences[stored.participant_id] = max(
            stored.sequence, session.last_sequences.get(stored.participant_id, 0)
        )
        if stored.base_eval_return is not None:
            await self._refresh_best(session)
        if session.goal.reached:
            session.notify()
        return stored

    async def _still_pending(self, session: Session, update: LoggedUpdate) -> bool:
        """At recovery: does this logged update still have to go into a version?

        Yes if it was never acknowledged (a crash between the log and the ack
        row: it is acknowledged now) or acknowledged but not yet applied. No
        if a version holds it, or if it is a second record of the same push
        (a retry after a failed ack): the ack row names the record it stands for.
        """
        key = (session.name, update.participant_id, update.sequence)
        ack = await self._db(lambda db: db.find_ack(*key))
        if ack is None:
            await self._acknowledge(session, update)
            return True
        return ack.lsn == update.lsn and ack.applied_version is None

    async def _stored_answer(self, session: Session, pid: str, sequence: int) -> PushResult:
        ack = await self._db(lambda db: db.find_ack(session.name, pid, sequence))
        if ack is None:
            last = session.last_sequences.get(pid, 0)
            raise PreconditionError(
                f"sequence {sequence} is below the last acknowledged {last} and was never "
                "acknowledged; sequence numbers must increase"
            )
        await self._count_duplicate(session, pid)
        return _result_from_ack(ack, duplicate=True)

    async def _count_duplicate(self, session: Session, pid: str) -> None:
        now = now_ms()
        await self._db(lambda db: db.count_duplicate(session.name, pid, now))

    def _staleness(self, session: Session, base_version: int) -> int:
        current = session.aggregator.current_version
        if not 0 <= base_version <= current:
            raise InvalidRequestError(
                f"base_version {base_version} does not exist; the newest is {current}"
            )
        staleness = current - base_version
        if staleness > self.config.max_staleness:
            raise PreconditionError(
                f"update is {staleness} versions stale (base {base_version}, current version "
                f"{current}, max staleness {self.config.max_staleness}); pull version {current} "
                "and train from it"
            )
        return staleness

    async def _refresh_best(self, session: Session) -> None:
        best = await self._db(lambda db: db.best_version(session.name))
        if best is not None:
            session.aggregator.note_best(best[0])

    # Pull.

    async def model(
        self, session_name: str, version: int, have_version: int, participant_id: str = ""
    ) -> ModelView:
        """The tensors PullModel streams: the full model, or a delta when have_version is kept.

        With a participant id, also which of its updates the version includes.
        """
        session = self.session(session_name)
        snapshot = session.aggregator.snapshot
        if snapshot is None:
            raise PreconditionError(f"session {session.name!r} has no model yet")
        target = snapshot.version if version < 0 else version
        tensors = await self._load(session, snapshot, target)
        names = [t.name for t in session.spec.tensors]
        # A delta from the version the client holds, when it is still here;
        # from the newest version itself it is all zeros, which costs nothing.
        have_kept = have_version >= 0 and (
            have_version == snapshot.version or session.store.has(have_version)
        )
        if have_kept:
            base = await self._load(session, snapshot, have_version)
            tensors = await asyncio.to_thread(_subtract, tensors, base)
        applied = (
            await self._db(lambda db: db.applied_sequence(session.name, participant_id, target))
            if participant_id
            else 0
        )
        return ModelView(
            session=session.name,
            version=target,
            from_version=have_version if have_kept else -1,
            is_delta=have_kept,
            spec_hash=session.spec_hash,
            tensors=list(zip(names, tensors, strict=True)),
            goal=session.goal,
            applied_sequence=applied,
        )

    async def _load(self, session: Session, snapshot: Snapshot, version: int) -> list[np.ndarray]:
        if version == snapshot.version:
            return list(snapshot.tensors)
        if not 0 <= version <= snapshot.version or not session.store.has(version):
            raise NotFoundError(
                f"version {version} of session {session.name!r} is not retained; "
                f"the newest is {snapshot.version}"
            )
        try:
            loaded = await asyncio.to_thread(session.store.load, version)
        except FileNotFoundError:
            # Pruned by retention between the check above and the read.
            raise NotFoundError(
                f"version {version} of session {session.name!r} was just pruned; "
                f"the newest is {snapshot.version}"
            ) from None
        return [tensor for _, tensor in loaded]

    # Status, version notices and the goal.

    async def status(self, session_name: str, max_versions: int) -> pb.StatusReply:
        name = self.session(session_name).name if session_name else None
        limit = max_versions or self.config.status_versions
        now = now_ms()
        return await self._db(lambda db: self._with_strategies(db.status(name, limit, now)))

    def notice(self, session_name: str) -> pb.VersionNotice:
        return self.session(session_name).notice()

    async def raise_goal(self, session_name: str, total_episodes: int) -> pb.GoalState:
        session = self.session(session_name)
        if total_episodes < session.goal_total:
            raise InvalidRequestError(
                f"the goal can only be raised: it is {session.goal_total}, "
                f"{total_episodes} was asked"
            )
        if total_episodes > session.goal_total:
            await self._db(lambda db: db.set_goal(session.name, total_episodes))
            session.goal_total = total_episodes
            session.notify()
            self._global_state_changed()
        return session.goal

    def session(self, session_name: str) -> Session:
        """The session by name ('' is the default session); NotFoundError if none."""
        name = validate_session_name(session_name)
        session = self._sessions.get(name)
        if session is None:
            raise NotFoundError(f"no session named {name!r} on this server; Join creates it")
        return session

    # Internals.

    def _member(self, session: Session, participant_id: str) -> str:
        pid = validate_id(participant_id)
        if pid not in session.participants:
            raise PreconditionError(
                f"participant {pid!r} has not joined session {session.name!r}; call Join first"
            )
        return pid

    def _check_hash(self, session: Session, claimed_hash: str) -> None:
        if claimed_hash != session.spec_hash:
            raise PreconditionError(
                f"spec_hash {claimed_hash or '(empty)'} differs from the spec hash of session "
                f"{session.name!r} ({session.spec_hash}); Join again with the session's model"
            )

    async def _create(self, name: str, spec: tpb.ModelSpec, digest: str, mode: str) -> Session:
        goal = self.config.goal_episodes
        now = now_ms()
        population = mode == POPULATION
        await self._db(
            lambda db: db.create_session(name, spec, digest, goal, now, population=population)
        )
        session = await self._recover(SessionRow(name, spec, digest, goal, 0, 0, population))
        log.info("session %r created (%s, spec %s)", name, _described(mode), digest[:12])
        return session

    async def _recover(self, row: SessionRow) -> Session:
        """Rebuild and register a session: newest committed version, then the log after it."""
        root = self.config.data_dir / SESSIONS_DIR / safe_dirname(row.name)
        store = ModelStore(
            root / "checkpoints", keep_last=self.config.keep_last, keep_every=self.config.keep_every
        )
        update_log = await asyncio.to_thread(UpdateLog, root / "updates")
        latest = await self._db(lambda db: db.latest_version(row.name))
        snapshot = None
        if latest is not None:
            loaded = await asyncio.to_thread(store.load, latest.version)
            snapshot = Snapshot(latest.version, tuple(tensor for _, tensor in loaded))
            # A checkpoint written just before a crash, whose row never committed.
            await asyncio.to_thread(store.discard_after, latest.version)
        best = await self._db(lambda db: db.best_version(row.name))
        participants = await self._db(lambda db: db.participant_statuses(row.name))
        aggregator = Aggregator(
            session=row.name,
            names=[t.name for t in row.spec.tensors],
            store=store,
            update_log=update_log,
            db=self._db,
            strategy=self._strategy(row.name),
            settings=AggregatorSettings(
                buffer_size=self.config.buffer_size,
                active_window_s=self.config.active_window_s,
                buffer_timeout_s=self.config.buffer_timeout_s,
                server_lr=self.config.server_lr,
                clip_norm=self.config.clip_norm,
            ),
            data_dir=self.config.data_dir,
            metrics_path=self.config.data_dir / METRICS_FILE,
            on_version=lambda version: self._on_version(row.name),
            discard_watermark=lambda: self.discard_watermark(row.name),
            set_aside=lambda update, reason: self.quarantine(row.name, update, reason),
            snapshot=snapshot,
            best_version=best[0] if best else -1,
            on_metrics=self._version_events.write if self._version_events else None,
        )
        session = Session(
            name=row.name,
            spec=row.spec,
            spec_hash=row.spec_hash,
            goal_total=row.goal_total,
            episodes_done=row.episodes_done,
            aggregator=aggregator,
            store=store,
            update_log=update_log,
            last_sequences=await self._db(lambda db: db.last_sequences(row.name)),
            participants=set(participants),
            active={pid for pid, status in participants.items() if status == "active"},
            norm_bound=NormBound(factor=self.config.update_norm_factor),
            mode=POPULATION if row.population else FEDERATED,
        )
        self._sessions[row.name] = session
        replayed = 0
        for record in await asyncio.to_thread(lambda: list(update_log.replay_records(0))):
            check = functools.partial(StateDB.is_quarantined, session=row.name, lsn=record.lsn)
            if await self._db(check):
                continue
            if isinstance(record, UnreadableRecord):
                await self.quarantine(session.name, record, record.reason)
                continue
            try:
                pending = await self._still_pending(session, record)
            except Exception as exc:
                # Recovery never dies on a record: this one is set aside, the server starts.
                await self.quarantine(session.name, record, f"cannot be acknowledged: {exc!r}")
                continue
            if pending:
                session.aggregator.submit(record)
                replayed += 1
        if replayed:
            log.info("session %r: %d logged updates back in the buffer", row.name, replayed)
        session.aggregator.start()
        return session

    async def quarantine(
        self, session_name: str, record: LoggedUpdate | UnreadableRecord, reason: str
    ) -> None:
        """Set a logged record aside for good (server/quarantine.py): kept, logged, counted."""
        if isinstance(record, UnreadableRecord):
            payload, participant_id, sequence = record.payload, "", 0
        else:
            payload = record_payload(record)
            participant_id, sequence = record.participant_id, record.sequence
        directory = self.config.data_dir / SESSIONS_DIR / safe_dirname(session_name)
        note = {
            "session": session_name,
            "participant_id": participant_id,
            "sequence": sequence,
            "reason": reason,
            "quarantined_unix_ms": now_ms(),
        }
        path = await asyncio.to_thread(
            quarantine.keep, directory / quarantine.QUARANTINE_DIR, record.lsn, payload, note
        )
        file = str(path.relative_to(self.config.data_dir))
        now = now_ms()
        await self._db(
            lambda db: db.quarantine(
                session_name,
                lsn=record.lsn,
                participant_id=participant_id,
                sequence=sequence,
                reason=reason,
                now_ms=now,
                file=file,
            )
        )
        log.error(
            "session %r: update %d (participant %r, sequence %d) quarantined in %s: %s",
            session_name,
            record.lsn,
            participant_id,
            sequence,
            file,
            reason,
        )
        self._global_state_changed()

    async def discard_watermark(self, session_name: str) -> int:
        """Highest LSN through which the update log may be trimmed.

        Every record at or below it is in a committed version or was never
        acknowledged (a failed ack, which the client sends again). Pushes
        reach the buffer out of LSN order, so the newest folded LSN is not
        enough: the oldest unapplied ack and every append still on its way
        to the buffer hold the watermark back.
        """
        session = self._sessions[session_name]
        # Floors first: an append that starts after this gets a higher LSN.
        floor = min([*session.append_floors.values(), session.update_log.last_lsn])
        oldest = await self._db(lambda db: db.oldest_unapplied_lsn(session_name))
        return floor if oldest is None else min(floor, oldest - 1)

    def _strategy(self, session_name: str) -> Strategy:
        if self._injected_strategy is not None:
            return self._injected_strategy()
        name = self.config.strategy_for(session_name)
        options = {"trim_fraction": self.config.trim_fraction} if name == "trimmed_mean" else {}
        return make_strategy(name, **options)

    def _with_strategies(self, reply: pb.StatusReply) -> pb.StatusReply:
        """The state database keeps one server-wide config; each session shows its strategy."""
        for state in reply.sessions:
            state.config.strategy = self.config.strategy_for(state.session)
        return reply

    async def _on_version(self, session_name: str) -> None:
        self._sessions[session_name].notify()
        self._global_state_changed()

    def _global_state_changed(self) -> None:
        """Have global_state.json rewritten soon, without waiting for it.

        It is a copy for people who `cat` it (the database is the record), so
        a new version or a join need not wait for its JSON and fsync; changes
        made while a rewrite runs are folded into one more rewrite after it.
        """
        self._global_state_dirty = True
        if self._global_state_writer is None or self._global_state_writer.done():
            self._global_state_writer = asyncio.create_task(
                self._rewrite_global_state(), name="fedrl-global-state"
            )

    async def _rewrite_global_state(self) -> None:
        while self._global_state_dirty:
            self._global_state_dirty = False
            try:
                await self._write_global_state()
            except Exception:
                log.exception("writing %s failed; retried at the next change", GLOBAL_STATE_FILE)
            # A busy server makes several versions a second; its readers need
            # no more than a fresh copy a second, and the CPU goes to pushes.
            await asyncio.sleep(GLOBAL_STATE_MIN_INTERVAL_S)

    async def _write_global_state(self) -> None:
        now = now_ms()
        limit = self.config.status_versions
        status = self._with_strategies
        reply = await self._db(lambda db: status(db.status(None, limit, now)))
        # Formatting and fsync off the database thread, where acks wait their turn.
        await asyncio.to_thread(
            write_json_atomically, self.config.data_dir / GLOBAL_STATE_FILE, reply
        )


def check_spec(spec: tpb.ModelSpec, *, max_model_bytes: int) -> None:
    """Refuse a spec no update could ever match, before it fixes a session."""
    if not spec.tensors:
        raise InvalidRequestError("the model spec lists no tensors")
    names = [t.name for t in spec.tensors]
    if len(set(names)) != len(names) or not all(names):
        raise InvalidRequestError("model spec tensor names must be non-empty and unique")
    _check_bounds(spec.observation_space, "observation_space")
    total = 0
    for tensor in spec.tensors:
        if tensor.dtype not in ACCEPTED_DELTA_DTYPES:
            raise InvalidRequestError(
                f"model spec tensor {tensor.name!r} has dtype {tensor.dtype}; "
                "trainable tensors are float32, float16 or bfloat16"
            )
        _check_dims(tensor.shape, f"model spec tensor {tensor.name!r}")
        total += math.prod(tensor.shape) * 4
    if total > max_model_bytes:
        raise LimitExceededError(
            f"the model is {total} bytes as float32, above this server's limit of "
            f"{max_model_bytes} (--max-model-bytes)"
        )


def _check_bounds(space: tpb.SpaceSpec, what: str) -> None:
    """Box bounds the experience validation can hold observations to: none, or one per element."""
    _check_dims(space.shape, f"{what}.shape")
    if not space.low and not space.high:
        return
    size = math.prod(space.shape)
    if len(space.low) != size or len(space.high) != size:
        raise InvalidRequestError(
            f"{what} has {len(space.low)} low and {len(space.high)} high bounds; "
            f"its shape {_shape_text(space.shape)} needs {size} of each (or none)"
        )
    for index, (low, high) in enumerate(zip(space.low, space.high, strict=True)):
        if not low <= high:
            raise InvalidRequestError(
                f"{what} bound {index} is low {low}, high {high}; bounds need low <= high"
            )


def _check_dims(shape: Sequence[int], what: str) -> None:
    if len(shape) > MAX_DIMS:
        raise InvalidRequestError(
            f"{what} has {len(shape)} dimensions {_shape_text(shape)}; at most {MAX_DIMS}"
        )
    if any(dim < 0 for dim in shape):
        raise InvalidRequestError(f"{what} has a negative dimension {_shape_text(shape)}")


def _shape_text(shape: Sequence[int]) -> str:
    """A shape for a message: whole when short, its first dimensions and a count when long."""
    dims = list(shape)
    if len(dims) <= 8:
        return str(dims)
    return f"[{', '.join(map(str, dims[:8]))}, ... ({len(dims)} dimensions)]"


def check_tensors(spec: tpb.ModelSpec, tensors: NamedTensors, *, what: str) -> NamedTensors:
    """Tensors in the spec's order, names and shapes, as float32; InvalidRequestError if not."""
    if len(tensors) != len(spec.tensors):
        raise InvalidRequestError(
            f"{what} has {len(tensors)} tensors, the session's model has {len(spec.tensors)}"
        )
    checked: NamedTensors = []
    for index, ((name, array), expected) in enumerate(zip(tensors, spec.tensors, strict=True)):
        if name != expected.name:
            raise InvalidRequestError(
                f"{what} tensor {index} is {name!r}, the session's model has {expected.name!r}"
            )
        if tuple(array.shape) != tuple(expected.shape):
            raise InvalidRequestError(
                f"{what} tensor {name!r} has shape {list(array.shape)}, "
                f"the session's model has {list(expected.shape)}"
            )
        if array.dtype.kind != "f":
            raise InvalidRequestError(f"{what} tensor {name!r} is {array.dtype}, not floating")
        values = np.asarray(array, dtype=np.float32)
        # The decoders check this too; the domain does not rely on every caller being one.
        if not np.isfinite(values).all():
            raise InvalidRequestError(f"{what} tensor {name!r} contains NaN or infinite values")
        checked.append((name, values))
    return checked


def check_update(
    spec: tpb.ModelSpec, tensors: NamedTensors, *, max_norm: float
) -> tuple[NamedTensors, float]:
    """check_tensors, then check_norm: an update the session can take, as float32, and its norm."""
    checked = check_tensors(spec, tensors, what="update")
    norm = l2_norm([tensor for _, tensor in checked])
    check_norm(norm, max_norm=max_norm)
    return checked, norm


def check_norm(norm: float, *, max_norm: float) -> None:
    """Refuse an update whose global L2 norm is above max_norm (0: no absolute bound).

    Clipping (--clip-norm) shrinks such an update and still applies it; a
    bound refuses it, for groups whose members need not trust each other.
    The relative bound (server/norm_bound.py) applies besides this one.
    """
    if max_norm > 0 and norm > max_norm:
        raise InvalidRequestError(
            f"update norm {norm:.6g} exceeds this server's bound of {max_norm:g} "
            "(--max-update-norm); check the learning rate, or sync more often"
        )


def _described(mode: str) -> str:
    return "a population (pbt)" if mode == POPULATION else "federated (averaging)"


def _refuse_in_population(session: Session, what: str) -> None:
    if session.mode == POPULATION:
        raise PreconditionError(
            f"session {session.name!r} is a population (pbt): its members report their own "
            f"models (Population.Report) and never {what}"
        )


def validate_id(raw: str) -> str:
    try:
        return validate_participant_id(raw)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


def validate_session_name(raw: str) -> str:
    """Session names follow the participant id rules: they name a directory too."""
    try:
        return validate_participant_id(raw or DEFAULT_SESSION)
    except ValueError as exc:
        raise InvalidRequestError(str(exc).replace("participant id", "session name")) from None


def now_ms() -> int:
    return int(time.time() * 1000)


def _result_from_ack(ack: AckRow, *, duplicate: bool) -> PushResult:
    return PushResult(
        sequence=ack.sequence,
        duplicate=duplicate,
        current_version=ack.current_version,
        staleness=ack.staleness,
        weight=ack.weight,
        goal=goal_state(ack.goal_total, ack.goal_done),
    )


def _as_duplicate(result: PushResult) -> PushResult:
    return PushResult(
        sequence=result.sequence,
        duplicate=True,
        current_version=result.current_version,
        staleness=result.staleness,
        weight=result.weight,
        goal=result.goal,
    )


def _subtract(minuend: list[np.ndarray], subtrahend: list[np.ndarray]) -> list[np.ndarray]:
    return [a - b for a, b in zip(minuend, subtrahend, strict=True)]
