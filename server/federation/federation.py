"""The federation's sessions: open and recover them, join, leave, seed, push, pull, the goal.

Plain asyncio classes with no gRPC in them: the servicer
(federation/service.py) translates messages to these calls and the refusals
they raise (server/refusals.py) to status codes, so every rule here is
reachable from a unit test without a network. The push pipeline is
federation/push.py and pulls federation/pull.py; this module keeps the
registry of sessions and their lifecycle: at start each session is rebuilt
from its newest committed version and the update log after it.

Whoever shows the state (global_state.json, from the status read model
above the features) observes the federation: `changed` once anything a
status shows moved, `closing` once the last versions are folded and before
the state database closes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from fedrl.common.group_rules import LEGACY_RULES, GroupRules, RuleChoices, RulesError, refusal
from fedrl.common.group_rules_serde import rules_to_proto
from fedrl.common.spec import spec_difference, spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.config import ServerConfig
from fedrl.server.experience.store import last_acknowledged
from fedrl.server.federation import ratings
from fedrl.server.federation.aggregator import (
    Aggregator,
    AlreadySeededError,
    NamedTensors,
    Snapshot,
)
from fedrl.server.federation.checks import ACCEPTED_DELTA_DTYPES, check_spec, check_tensors
from fedrl.server.federation.pull import model_view
from fedrl.server.federation.push import Pushes
from fedrl.server.federation.quarantine import set_aside
from fedrl.server.federation.session import (
    FEDERATED,
    POPULATION,
    JoinResult,
    ModelView,
    PushRequest,
    PushResult,
    Session,
    described,
)
from fedrl.server.federation.version_events import VersionEvents
from fedrl.server.federation.versions import VELOCITY_DIR, Versions
from fedrl.server.names import (
    DB_FILE,
    METRICS_FILE,
    TENSORBOARD_DIR,
    now_ms,
    session_dir,
    validate_id,
    validate_session_name,
)
from fedrl.server.refusals import (
    AlreadyExistsError,
    InvalidRequestError,
    NotFoundError,
    PreconditionError,
    RequestRefusedError,
)
from fedrl.server.storage.db_runner import DbRunner
from fedrl.server.storage.model_store import ModelStore
from fedrl.server.storage.state_db import SessionRow, StateDB
from fedrl.server.storage.update_log import UpdateLog
from fedrl.server.storage.update_record import LoggedUpdate, UnreadableRecord
from fedrl.server.strategy.registry import strategy_from_settings
from fedrl.server.strategy.strategy import Rule, Strategy

log = logging.getLogger(__name__)

NO_CHOICES = RuleChoices()
"""A Join that chose none of the session's rules: it takes the session's."""
MAX_DATA_SOURCE_CHARS = 1_000
"""A data source is a URL and a table or query name: a line, never a document."""


class Observer(Protocol):
    """Who follows the federation's state (global_state.json, say)."""

    def changed(self) -> None:
        """Something a status shows moved: a join, a leave, a version, a goal, a quarantine."""

    async def closing(self) -> None:
        """The last versions are folded; the state database closes once this returns."""


class Federation:
    """All sessions of one server; the domain behind the Federation service."""

    def __init__(
        self,
        config: ServerConfig,
        db: DbRunner,
        *,
        strategy: Callable[[Rule], Strategy] | None = None,
    ) -> None:
        self.config = config
        self._db = db
        self.pushes = Pushes(db, max_pending=config.max_pending)
        # Each session's aggregator gets its own strategy object: the injected
        # factory's, or the one the config names for that session.
        self._injected_strategy = strategy
        self._sessions: dict[str, Session] = {}
        self._create_lock = asyncio.Lock()
        self._observers: list[Observer] = []
        self.closing = asyncio.Event()
        self._version_events = (
            VersionEvents(config.data_dir / TENSORBOARD_DIR) if config.tensorboard else None
        )

    # Start and stop.

    @classmethod
    async def open(
        cls, config: ServerConfig, *, strategy: Callable[[Rule], Strategy] | None = None
    ) -> Federation:
        """Open the data dir and recover every session to its last committed version.

        `strategy` makes the aggregation strategy of each session from the
        server's rule, replacing the one config.strategy names (e.g. a
        Strategy subclass of one's own).
        """
        config.data_dir.mkdir(parents=True, exist_ok=True)
        runner = DbRunner(await asyncio.to_thread(StateDB, config.data_dir / DB_FILE))
        await runner(lambda db: db.create_tables(ratings.SCHEMA))
        federation = cls(config, runner, strategy=strategy)
        await runner(lambda db: db.save_session_config(federation.session_config()))
        # Sessions created before sessions had rules ran by the clients' defaults of the
        # time: recorded once, they are those sessions' rules.
        legacy = rules_to_proto(LEGACY_RULES)
        for name in await runner(lambda db: db.record_missing_rules(legacy)):
            log.info("session %r predates the session's rules: it keeps the defaults", name)
        for row in await runner(lambda db: db.sessions()):
            await federation._recover(row)
        return federation

    def observe(self, observer: Observer) -> None:
        """Tell `observer` of every change from now on, and of the close."""
        self._observers.append(observer)

    async def close(self) -> None:
        """Fold buffered updates into a last version, then release files and the database."""
        self.closing.set()
        for session in self._sessions.values():
            await session.aggregator.close()
            session.update_log.close()
            session.notify()
        if self._version_events is not None:
            self._version_events.close()
        for observer in self._observers:
            await observer.closing()
        await asyncio.to_thread(self._db.close)

    @property
    def db(self) -> DbRunner:
        """The state database's runner, shared with the population and the status read model."""
        return self._db

    def population_changed(self, session: Session) -> None:
        """A population's members or goal moved: wake watchers, tell the observers."""
        session.notify()
        self._changed()

    def session_config(self, session_name: str | None = None) -> pb.SessionConfig:
        """The settings clients follow; with a session name, that session's strategy and
        rules (without, the server's defaults for new sessions)."""
        c = self.config
        rules = c.rules if session_name is None else self.session(session_name).rules
        return pb.SessionConfig(
            max_staleness=c.max_staleness,
            buffer_size=c.buffer_size,
            chunk_bytes=c.chunk_bytes,
            max_message_bytes=c.max_message_bytes,
            strategy=c.strategy if session_name is None else c.strategy_for(session_name),
            server_learning_rate=c.server_lr,
            sync_interval=rules.sync_interval,
            delta_dtypes=list(ACCEPTED_DELTA_DTYPES),
            global_eval_interval=c.global_eval_interval,
            push_rate_per_s=c.push_rate_per_s,
            pbt_ready_steps=c.pbt_ready_steps,
            pbt_quantile=c.pbt_quantile,
            pbt_resample_probability=c.pbt_resample_probability,
            rules=rules_to_proto(rules) if session_name is not None else None,
        )

    # Join and leave.

    async def join(
        self,
        session_name: str,
        participant_id: str,
        spec: tpb.ModelSpec,
        claimed_hash: str,
        *,
        mode: str = "",
        rules: RuleChoices = NO_CHOICES,
        data: tuple[str, bool] = ("", False),
    ) -> JoinResult:
        """Enter the session, creating it if need be: `mode` and the rules the participant
        chose (`rules`) fix a new session's; an existing session refuses a participant whose
        mode, model or rules differ from its own. `data`: what the participant trains on
        (source, synthetic), for status."""
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
                session = await self._create(name, spec, digest, mode, rules)
        if session.mode != mode:
            raise PreconditionError(
                f"session {name!r} is {described(session.mode)}, you asked for "
                f"{described(mode)}: join it with --mode {session.mode}, or use another --session"
            )
        if session.spec_hash != digest:
            difference = spec_difference(session.spec, spec) or "canonical form"
            raise PreconditionError(
                f"model spec differs from session {name!r}: {difference}; "
                "use a matching model or another --session"
            )
        refused = refusal(name, session.rules, rules)
        if refused is not None:
            raise PreconditionError(refused)
        now = now_ms()
        await self._db(lambda db: db.touch_participant(name, pid, "active", now))
        await self._db(lambda db: db.set_participant_data(name, pid, source, synthetic))
        experience_sequence = await self._db(lambda db: last_acknowledged(db.connection, name, pid))
        session.participants.add(pid)
        session.active.add(pid)
        session.notify()
        self._changed()
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
        pid = self.member(session, participant_id)
        now = now_ms()
        await self._db(lambda db: db.touch_participant(session.name, pid, "left", now))
        session.active.discard(pid)
        session.aggregator.forget(pid)
        session.notify()
        self._changed()

    # Seed.

    async def seed(
        self, session_name: str, participant_id: str, claimed_hash: str, tensors: NamedTensors
    ) -> int:
        session = self.session(session_name)
        pid = self.member(session, participant_id)
        session.check_hash(claimed_hash)
        session.refuse_in_population("seed a global model")
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
        pid = self.member(session, request.participant_id)
        return await self.pushes.check(session, pid, request)

    async def push(self, request: PushRequest, tensors: NamedTensors) -> PushResult:
        """Acknowledge a new update once it is durable (federation/push.py)."""
        session = self.session(request.session)
        pid = self.member(session, request.participant_id)
        return await self.pushes.push(session, pid, request, tensors)

    async def count_rejection(self, session_name: str, participant_id: str) -> None:
        """Count a refused update against its participant, where both are known."""
        try:
            session = self.session(session_name)
        except RequestRefusedError:
            return
        if participant_id in session.participants:
            await self.pushes.count_rejection(session, participant_id)

    # Pull.

    async def model(
        self, session_name: str, version: int, have_version: int, participant_id: str = ""
    ) -> ModelView:
        """What PullModel streams (federation/pull.py)."""
        session = self.session(session_name)
        return await model_view(self._db, session, version, have_version, participant_id)

    # Version notices and the goal.

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
            self._changed()
        return session.goal

    # Ratings of two-player games.

    async def report_ratings(
        self, session_name: str, participant_id: str, reported: Sequence[pb.PlayerRating]
    ) -> int:
        """Store a member's newest ratings (federation/ratings.py); how many were stored."""
        session = self.session(session_name)
        pid = self.member(session, participant_id)
        rows = ratings.checked(reported)
        now = now_ms()

        def write(db: StateDB) -> None:
            with db.transaction() as conn:
                ratings.record(conn, session.name, pid, rows, now)

        await self._db(write)
        self._changed()
        return len(rows)

    def session(self, session_name: str) -> Session:
        """The session by name ('' is the default session); NotFoundError if none."""
        name = validate_session_name(session_name)
        session = self._sessions.get(name)
        if session is None:
            raise NotFoundError(f"no session named {name!r} on this server; Join creates it")
        return session

    def member(self, session: Session, participant_id: str) -> str:
        """The participant's id, refused unless it joined the session."""
        pid = validate_id(participant_id)
        if pid not in session.participants:
            raise PreconditionError(
                f"participant {pid!r} has not joined session {session.name!r}; call Join first"
            )
        return pid

    # Lifecycle: create, recover, set aside.

    async def _create(
        self, name: str, spec: tpb.ModelSpec, digest: str, mode: str, choices: RuleChoices
    ) -> Session:
        goal = self.config.goal_episodes
        now = now_ms()
        population = mode == POPULATION
        rules = self._new_rules(name, choices)
        stored = rules_to_proto(rules)
        await self._db(
            lambda db: db.create_session(
                name, spec, digest, goal, now, rules=stored, population=population
            )
        )
        row = SessionRow(name, spec, digest, goal, 0, 0, population, stored.SerializeToString())
        session = await self._recover(row)
        log.info("session %r created (%s, spec %s)", name, described(mode), digest[:12])
        return session

    def _new_rules(self, name: str, choices: RuleChoices) -> GroupRules:
        """A new session's rules: the server's for it, then its first participant's choices,
        which may not differ from a rule the server fixes for the session (--session-rule)."""
        defaults, fixed = self.config.rules_for(name)
        refused = refusal(name, defaults, choices.only(fixed.chosen()))
        if refused is not None:
            raise PreconditionError(f"the server fixes this rule: {refused}")
        try:
            return defaults.with_choices(choices)
        except RulesError as exc:
            raise InvalidRequestError(
                f"session {name!r} cannot be created with these rules: {exc}"
            ) from None

    async def _recover(self, row: SessionRow) -> Session:
        """Rebuild and register a session: newest committed version, then the log after it."""
        root = session_dir(self.config.data_dir, row.name)
        store = ModelStore(
            root / "checkpoints", keep_last=self.config.keep_last, keep_every=self.config.keep_every
        )
        velocities = ModelStore(root / VELOCITY_DIR)
        update_log = await asyncio.to_thread(UpdateLog, root / "updates")
        strategy = self._strategy(row.name)
        latest = await self._db(lambda db: db.latest_version(row.name))
        snapshot = None
        if latest is not None:
            keeps_velocity = strategy.rule.server_momentum > 0
            snapshot = await asyncio.to_thread(
                _committed, store, velocities, latest.version, keeps_velocity
            )
        norms = await self._db(lambda db: db.recent_norms(row.name, strategy.norm_window))
        strategy.restore_norms(norms)
        best = await self._db(lambda db: db.best_version(row.name))
        participants = await self._db(lambda db: db.participant_statuses(row.name))
        versions = Versions(
            session=row.name,
            names=[t.name for t in row.spec.tensors],
            store=store,
            velocities=velocities,
            update_log=update_log,
            db=self._db,
            data_dir=self.config.data_dir,
            metrics_path=self.config.data_dir / METRICS_FILE,
            discard_watermark=lambda: self.discard_watermark(row.name),
            best_version=best[0] if best else -1,
            on_metrics=self._version_events.write if self._version_events else None,
        )
        aggregator = Aggregator(
            session=row.name,
            strategy=strategy,
            versions=versions,
            on_version=lambda version: self._on_version(row.name),
            set_aside=lambda update, reason: self.quarantine(row.name, update, reason),
            snapshot=snapshot,
        )
        session = Session(
            name=row.name,
            spec=row.spec,
            spec_hash=row.spec_hash,
            goal_total=row.goal_total,
            episodes_done=row.episodes_done,
            aggregator=aggregator,
            strategy=strategy,
            store=store,
            update_log=update_log,
            last_sequences=await self._db(lambda db: db.last_sequences(row.name)),
            participants=set(participants),
            active={pid for pid, status in participants.items() if status == "active"},
            mode=POPULATION if row.population else FEDERATED,
            rules=row.group_rules,
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
                pending = await self.pushes.still_pending(session, record)
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
        """Set a logged record aside for good (federation/quarantine.py): kept, logged, counted."""
        await set_aside(self._db, self.config.data_dir, session_name, record, reason)
        self._changed()

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
        """A session's own strategy object: the injected one, or the one the config names."""
        rule = self.config.rule
        if self._injected_strategy is not None:
            return self._injected_strategy(rule)
        return strategy_from_settings(self.config.strategy_for(session_name), rule, self.config)

    async def _on_version(self, session_name: str) -> None:
        self._sessions[session_name].notify()
        self._changed()

    def _changed(self) -> None:
        for observer in self._observers:
            observer.changed()


def _committed(
    store: ModelStore, velocities: ModelStore, version: int, keeps_velocity: bool
) -> Snapshot:
    """The newest committed version, with the velocity its strategy carries when it keeps one.

    Files of later versions are deleted: written just before a crash, their
    rows never committed. A velocity the data dir lacks (momentum turned on
    since) starts from zeros.
    """
    tensors = tuple(tensor for _, tensor in store.load(version))
    velocity = None
    if keeps_velocity and velocities.has(version):
        velocity = tuple(tensor for _, tensor in velocities.load(version))
    store.discard_after(version)
    velocities.discard_after(version)
    return Snapshot(version, tensors, velocity)
