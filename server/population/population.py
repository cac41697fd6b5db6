"""Population-based training across a session: enroll members, take their reports, serve donors.

The domain behind the Population service (population/service.py), with no
gRPC in it. A session becomes a population by its first Join (mode "pbt",
federation/federation.py); members then Enroll with their hyperparameters
and Report their latest model and score. The rule that ranks them is
population/exploit_explore.py, the records are population/records.py.

Durability, as for every other server state: a report's model is written to
its own file (one per member and report sequence, fsynced and renamed into
place: storage/model_store.py) before the transaction that takes the report
names it; that transaction also makes the ranking's decision, so a decision
is visible exactly when committed. A kill before the commit leaves a file no
row names, which `open` deletes at the next start; files the rows stop
needing are deleted after the commit that stopped needing them (or, after a
kill in between, at the next start). So the latest model of every member, and
the donor model of every exploit not yet adopted, are always on disk.

Files: `<data dir>/sessions/<session>/population/<member>/vNNNNNNNN.npz`,
NNNNNNNN the report's sequence: plain numpy archives, as global checkpoints;
the learner reported with that model (ReportHeader.learner: target network,
optimizer state, schedule positions, newest replay transitions, opaque
here) beside it in `<member>/learner/vNNNNNNNN.npz`, written before the
model and deleted with it, so a model a row names has its learner whenever
the member sent one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fedrl.common.hyperparameters import SEARCHED, check_hyperparameters
from fedrl.common.identity import safe_dirname
from fedrl.server.config import ServerConfig
from fedrl.server.federation.aggregator import NamedTensors
from fedrl.server.federation.checks import check_tensors
from fedrl.server.federation.federation import Federation
from fedrl.server.federation.session import POPULATION, Session
from fedrl.server.names import now_ms, session_dir
from fedrl.server.population import records
from fedrl.server.population.records import (
    Assignment,
    MemberReport,
    NotEnrolledError,
    Ranking,
    ReportOutcome,
)
from fedrl.server.refusals import InvalidRequestError, NotFoundError, PreconditionError
from fedrl.server.storage.model_store import ModelStore, read_checkpoint
from fedrl.server.storage.state_db import StateDB
from fedrl.server.transport.request_fields import check_int, check_metric

log = logging.getLogger(__name__)

POPULATION_DIR = "population"
LEARNER_DIR = "learner"


@dataclass(frozen=True)
class ReportRequest:
    """A report's header as the domain sees it."""

    session: str
    participant_id: str
    spec_hash: str
    sequence: int
    generation: int
    env_steps: int
    episodes: int
    score: float | None

    def __post_init__(self) -> None:
        check_int(self.sequence, "ReportHeader.sequence", low=1)
        check_int(self.generation, "ReportHeader.generation", low=0)
        check_int(self.env_steps, "ReportHeader.env_steps", low=0)
        check_int(self.episodes, "ReportHeader.episodes", low=0)
        if self.score is not None:
            check_metric(self.score, "ReportHeader.score")


@dataclass(frozen=True)
class DonorModel:
    """What PullDonor streams."""

    session: str
    generation: int
    spec_hash: str
    tensors: NamedTensors


@dataclass(frozen=True)
class DonorLearner:
    """What PullDonorLearner streams: None when the donor reported no learner."""

    session: str
    generation: int
    tensors: NamedTensors | None


class Population:
    """Every population session of one server."""

    def __init__(self, config: ServerConfig, federation: Federation) -> None:
        self._config = config
        self._federation = federation
        self._db = federation.db
        self._ranking = Ranking(
            ready_steps=config.pbt_ready_steps,
            quantile=config.pbt_quantile,
            resample_probability=config.pbt_resample_probability,
            score_window=config.pbt_score_window,
        )
        self._stores: dict[tuple[str, str], ModelStore] = {}

    async def open(self) -> None:
        """Create the population's tables, then delete model files no committed row needs
        (a kill between a write and its commit)."""
        await self._db(lambda db: db.create_tables(records.SCHEMA))
        rows = await self._db(lambda db: db.sessions())
        for name in sorted(row.name for row in rows if row.population):
            kept = await self._db(functools.partial(_referenced, session=name))
            await asyncio.to_thread(self._remove_unneeded, name, kept)

    # Enroll.

    async def enroll(
        self, session_name: str, participant_id: str, hyperparameters: Mapping[str, float]
    ) -> Assignment:
        session = self._population(session_name)
        pid = self._federation.member(session, participant_id)
        values = self._check_hyperparameters(session, hyperparameters)
        now = now_ms()

        def enroll(db: StateDB) -> Assignment:
            with db.transaction() as conn:
                return records.enroll(conn, session.name, pid, values, now)

        assignment = await self._db(enroll)
        self._federation.population_changed(session)
        return assignment

    @property
    def replay_transitions(self) -> int:
        """Newest replay transitions a DQN member sends with its learner (MemberAssignment)."""
        return self._config.pbt_replay_transitions

    # Report.

    async def report(
        self, request: ReportRequest, tensors: NamedTensors, learner: NamedTensors | None = None
    ) -> ReportOutcome:
        """Keep the member's model, its learner and figures; rank it when it is ready (module
        docstring)."""
        session = self._population(request.session)
        pid = self._federation.member(session, request.participant_id)
        session.check_hash(request.spec_hash)
        known = await self._db(lambda db: records.assignment(db.connection, session.name, pid))
        if known is None:
            raise PreconditionError(f"{pid} has not enrolled in population {session.name!r}")
        path = ""
        if request.sequence > known.last_sequence and request.generation >= known.generation:
            checked = await asyncio.to_thread(check_tensors, session.spec, tensors, what="report")
            path = await asyncio.to_thread(
                self._write, session.name, pid, request, checked, learner
            )
        member_report = MemberReport(
            session=session.name,
            participant_id=pid,
            sequence=request.sequence,
            generation=request.generation,
            env_steps=request.env_steps,
            episodes=request.episodes,
            score=request.score,
            checkpoint=path,
            now_ms=now_ms(),
        )

        def record(db: StateDB) -> ReportOutcome:
            with db.transaction() as conn:
                return records.record_report(conn, member_report, self._ranking)

        try:
            outcome = await self._db(record)
        except NotEnrolledError as exc:
            raise PreconditionError(str(exc)) from None
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        await asyncio.to_thread(self._delete, outcome.released)
        if outcome.verdict is not None:
            log.info("population %r: %s ranked: %s", session.name, pid, outcome.verdict.reason)
        session.episodes_done = max(session.episodes_done, outcome.goal_done)
        self._federation.population_changed(session)
        return outcome

    # Pull a donor.

    async def donor(self, session_name: str, participant_id: str, generation: int) -> DonorModel:
        session = self._population(session_name)
        pid = self._federation.member(session, participant_id)
        check_int(generation, "PullDonorRequest.generation", low=1)
        path = await self._db(
            lambda db: records.donor_checkpoint(db.connection, session.name, pid, generation)
        )
        if path is None:
            raise NotFoundError(
                f"{pid} has no generation {generation} in population {session.name!r}, "
                "so no donor model to copy"
            )
        try:
            tensors = await asyncio.to_thread(read_checkpoint, self._config.data_dir / path)
        except FileNotFoundError:
            raise NotFoundError(
                f"the donor model of {pid}'s generation {generation} is no longer kept: it was "
                "adopted; Enroll again to learn your generation"
            ) from None
        return DonorModel(session.name, generation, session.spec_hash, tensors)

    async def donor_learner(
        self, session_name: str, participant_id: str, generation: int
    ) -> DonorLearner:
        """The learner reported with the model `donor` serves for the same generation."""
        model = await self.donor(session_name, participant_id, generation)
        path = await self._db(
            lambda db: records.donor_checkpoint(
                db.connection, model.session, participant_id, generation
            )
        )
        assert path is not None
        try:
            tensors = await asyncio.to_thread(
                read_checkpoint, learner_path(self._config.data_dir / path)
            )
        except FileNotFoundError:
            tensors = None
        return DonorLearner(model.session, generation, tensors)

    # Internals.

    def _population(self, session_name: str) -> Session:
        session = self._federation.session(session_name)
        if session.mode != POPULATION:
            raise PreconditionError(
                f"session {session.name!r} averages weights; population calls need a session "
                "created with --mode pbt"
            )
        return session

    def _check_hyperparameters(
        self, session: Session, values: Mapping[str, float]
    ) -> dict[str, float]:
        algorithm = session.spec.algorithm.split("/", 1)[0]
        wanted = SEARCHED.get(algorithm)
        if wanted is None:
            raise PreconditionError(
                f"population-based training searches DQN's and PPO's hyperparameters; session "
                f"{session.name!r} learns with {session.spec.algorithm!r}"
            )
        if set(values) != set(wanted):
            raise InvalidRequestError(
                f"a {algorithm} member enrolls with {', '.join(wanted)}; got "
                f"{', '.join(sorted(values)) or 'none'}"
            )
        try:
            return check_hyperparameters(values)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None

    def _root(self, session: str) -> Path:
        return session_dir(self._config.data_dir, session) / POPULATION_DIR

    def _store(self, session: str, pid: str) -> ModelStore:
        key = (session, pid)
        if key not in self._stores:
            self._stores[key] = ModelStore(self._root(session) / safe_dirname(pid))
        return self._stores[key]

    def _write(
        self,
        session: str,
        pid: str,
        request: ReportRequest,
        tensors: NamedTensors,
        learner: NamedTensors | None,
    ) -> str:
        """The learner's file, then the model's: a model on disk has its learner beside it."""
        store = self._store(session, pid)
        try:
            if learner:
                ModelStore(store.root / LEARNER_DIR).write(request.sequence, learner)
            path = store.write(request.sequence, tensors)
        except ValueError as exc:
            # The same sequence with another model: a client that lost count.
            raise InvalidRequestError(f"report {request.sequence}: {exc}") from None
        return str(path.relative_to(self._config.data_dir))

    def _delete(self, paths: tuple[str, ...]) -> None:
        for path in paths:
            model = self._config.data_dir / path
            model.unlink(missing_ok=True)
            learner_path(model).unlink(missing_ok=True)

    def _remove_unneeded(self, session: str, kept: set[str]) -> None:
        root = self._root(session)
        if not root.is_dir():
            return
        for member in root.iterdir():
            learners = member / LEARNER_DIR
            stores = [ModelStore(member), *([ModelStore(learners)] if learners.is_dir() else [])]
            for store in stores:
                for sequence in store.versions():
                    path = store.path(sequence)
                    model = member / path.name
                    if str(model.relative_to(self._config.data_dir)) not in kept:
                        log.info("population %r: removing %s, which no record needs", session, path)
                        path.unlink()


def learner_path(model: Path) -> Path:
    """Where the learner reported with the model file `model` is kept."""
    return model.parent / LEARNER_DIR / model.name


def _referenced(db: StateDB, session: str) -> set[str]:
    return records.referenced_checkpoints(db.connection, session)
