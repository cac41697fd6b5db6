"""The experience exchange's domain rules: who may push, validation, exactly-once, budgets.

Plain asyncio with no gRPC in it, as federation/federation.py is for the
federation: the servicer (experience/service.py) turns stream messages into
these calls and the refusals they raise (server/refusals.py) into status
codes, so every rule here is reachable from a unit test without
a network.

Sessions and membership come from the server's state database, read through
StateDB (read-only): a participant must have joined the session with the
Federation service first. The stores keep their own tables in the same
database file, through their own connection. Every store call runs on one
dedicated thread (the stores are single-owner) and the event loop never
waits on an fsync.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from fedrl.common.chunking import DEFAULT_CHUNK_BYTES, DecodeLimits
from fedrl.common.experience import ExperienceBatch, batch_header, decode_batch, encode_batch
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.experience.store import (
    Ack,
    BatchTooLargeError,
    ExperienceStore,
    SequenceError,
    StoreConfig,
    StoredBatch,
)
from fedrl.server.experience.validation import InvalidBatchError, ValidationLimits, validate_batch
from fedrl.server.names import DB_FILE, now_ms, session_dir, validate_session_name
from fedrl.server.refusals import (
    InvalidRequestError,
    NotFoundError,
    PreconditionError,
    RequestRefusedError,
)
from fedrl.server.storage.state_db import StateDB
from fedrl.server.transport.limits import LimitsConfig
from fedrl.server.transport.request_fields import check_int

T = TypeVar("T")

EXPERIENCE_DIR = "experience"


@dataclass(frozen=True)
class ExperienceConfig:
    """Settings of the experience exchange on one server."""

    store: StoreConfig = field(default_factory=StoreConfig)
    """Bounds of each session's store."""
    validation: ValidationLimits = field(default_factory=ValidationLimits)
    """What one batch may hold."""
    default_pull_transitions: int = 4096
    """Budget of a pull that names none (max_transitions 0)."""
    max_pull_transitions: int = 65_536
    """Largest budget one pull may ask for; ~3 MB of CartPole, bounded for other envs too."""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """Largest data field of a chunk sent or accepted."""
    max_batch_raw_bytes: int = 64 << 20
    """Decoded bytes of one pushed batch, held in memory until it validates (trading: ~16 MB)."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Per-participant limits, the Federation service's: batches pushed per second (each
    batch header takes a token), open streams, and the idle timeout of a half-sent push."""

    def __post_init__(self) -> None:
        if not 1 <= self.default_pull_transitions <= self.max_pull_transitions:
            raise ValueError(
                "default_pull_transitions must lie in 1..max_pull_transitions, got "
                f"{self.default_pull_transitions} and {self.max_pull_transitions}"
            )
        if self.chunk_bytes <= 0 or self.max_batch_raw_bytes <= 0:
            raise ValueError("chunk_bytes and max_batch_raw_bytes must be positive")


@dataclass(frozen=True)
class _Session:
    name: str
    spec: tpb.ModelSpec
    spec_hash: str


class ExperienceExchange:
    """Sessions' experience stores behind the service: push once, validated; pull others'."""

    def __init__(self, data_dir: Path, config: ExperienceConfig) -> None:
        self._data_dir = data_dir
        self._config = config
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedrl-experience")
        # Opened on the executor thread at first use: the Federation creates
        # the database when the server starts, after this object exists.
        self._state: StateDB | None = None
        self._db: sqlite3.Connection | None = None
        self._stores: dict[str, ExperienceStore] = {}
        self._sessions: dict[str, _Session] = {}

    @property
    def config(self) -> ExperienceConfig:
        return self._config

    @property
    def decode_limits(self) -> DecodeLimits:
        """What one pushed batch may declare, checked before a byte of it is accepted."""
        return DecodeLimits(
            # A batch's columns travel as one block tensor.
            max_tensors=1,
            max_total_raw_bytes=self._config.max_batch_raw_bytes,
            max_chunk_bytes=self._config.chunk_bytes,
        )

    async def close(self) -> None:
        """Close the stores and the database connections."""
        await self._run(self._close_all)
        self._executor.shutdown(wait=True)

    # Push.

    async def check_push(self, session_name: str, participant_id: str, sequence: int) -> None:
        """Refuse a batch before reading its columns: unknown session, non-member, bad sequence."""
        await self._member_session(session_name, participant_id)
        check_int(sequence, "ExperienceHeader.sequence", low=1)

    async def push(
        self, session_name: str, participant_id: str, sequence: int, batch: ExperienceBatch
    ) -> Ack:
        """Validate a decoded batch and store it once; a refusal is counted against the sender."""
        session = await self._member_session(session_name, participant_id)
        store = await self._run(lambda: self._store(session))
        known = await self._run(
            lambda: store.answer_duplicate(participant_id, sequence, now_ms=now_ms())
        )
        if known is not None:
            return known
        try:
            # A pass over every value of the batch: off the event loop.
            await asyncio.to_thread(
                validate_batch,
                batch,
                spec=session.spec,
                spec_hash=session.spec_hash,
                limits=self._config.validation,
            )
        except InvalidBatchError as exc:
            await self.count_rejection(session_name, participant_id)
            raise InvalidRequestError(f"batch {sequence} refused: {exc}") from None
        # Re-encoded here: what the store keeps and serves is always our own
        # canonical zstd, whatever codec and action width the sender chose.
        stored = await asyncio.to_thread(
            _encoded,
            batch,
            session=session.name,
            participant_id=participant_id,
            sequence=sequence,
            cursor=0,
            codec=tpb.CODEC_ZSTD,
        )
        try:
            return await self._run(lambda: store.append(stored, now_ms=now_ms()))
        except BatchTooLargeError as exc:
            await self.count_rejection(session_name, participant_id)
            raise InvalidRequestError(str(exc)) from None
        except SequenceError as exc:
            raise PreconditionError(str(exc)) from None

    async def count_rejection(self, session_name: str, participant_id: str) -> None:
        """Count a refused batch against a participant of a known session; else nothing to count."""
        try:
            session = await self._member_session(session_name, participant_id)
        except RequestRefusedError:
            return
        store = await self._run(lambda: self._store(session))
        await self._run(lambda: store.count_rejection(participant_id, now_ms()))

    # Pull.

    async def pull(
        self, session_name: str, participant_id: str, *, cursor: int, max_transitions: int
    ) -> tuple[list[StoredBatch], int]:
        """Other participants' batches after the cursor within the budget, and the next cursor.

        A budget of 0 is the configured default; any budget is capped at the
        maximum. A batch larger than the budget comes whole and alone: the
        cursor counts batches, so a cut batch's other rows could never be
        asked for again (a batch is at most validation.max_transitions rows).
        """
        check_int(cursor, "PullExperienceRequest.cursor", low=0)
        session = await self._member_session(session_name, participant_id)
        budget = max_transitions or self._config.default_pull_transitions
        budget = min(budget, self._config.max_pull_transitions)
        store = await self._run(lambda: self._store(session))
        result = await self._run(
            lambda: store.read_after(cursor, exclude=participant_id, max_transitions=budget)
        )
        return result.batches, result.next_cursor

    def in_codec(self, stored: StoredBatch, codec: int) -> StoredBatch:
        """A stored batch as the caller asked for it: uncompressed, or as stored (zstd)."""
        if codec == tpb.CODEC_NONE:
            return _reencoded(stored, self._decode(stored), codec=tpb.CODEC_NONE)
        return stored

    def _decode(self, stored: StoredBatch) -> ExperienceBatch:
        """A stored batch decoded, under the same limits as a pushed one."""
        return decode_batch(stored.header, stored.block, stored.data, limits=self.decode_limits)

    # Internals.

    async def _run(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def _member_session(self, session_name: str, participant_id: str) -> _Session:
        name = validate_session_name(session_name)
        session, member = await self._run(lambda: self._lookup(name, participant_id))
        if session is None:
            raise NotFoundError(f"no session named {name!r} on this server; Join creates it")
        if not member:
            raise PreconditionError(
                f"participant {participant_id!r} has not joined session {name!r}; call Join first"
            )
        return session

    def _lookup(self, name: str, participant_id: str) -> tuple[_Session | None, bool]:
        state = self._open_state()
        session = self._sessions.get(name)
        if session is None:
            # A session's spec never changes once created, so it is read once.
            for row in state.sessions():
                if row.name == name:
                    session = self._sessions[name] = _Session(row.name, row.spec, row.spec_hash)
        if session is None:
            return None, False
        return session, state.is_participant(name, participant_id)

    def _open_state(self) -> StateDB:
        if self._state is None:
            self._state = StateDB(self._data_dir / DB_FILE, read_only=True)
        return self._state

    def _store(self, session: _Session) -> ExperienceStore:
        store = self._stores.get(session.name)
        if store is None:
            if self._db is None:
                self._db = sqlite3.connect(
                    self._data_dir / DB_FILE, check_same_thread=False, isolation_level=None
                )
                # Each commit is an ack promised to a participant: durable before it returns.
                self._db.execute("PRAGMA synchronous=FULL")
            directory = session_dir(self._data_dir, session.name) / EXPERIENCE_DIR
            store = ExperienceStore(
                directory=directory, db=self._db, session=session.name, config=self._config.store
            )
            self._stores[session.name] = store
        return store

    def _close_all(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._state is not None:
            self._state.close()
            self._state = None


def _encoded(
    batch: ExperienceBatch,
    *,
    session: str,
    participant_id: str,
    sequence: int,
    cursor: int,
    codec: int,
) -> StoredBatch:
    """batch in wire form under the given sender, sequence and store position."""
    encoded = encode_batch(batch, codec=codec)
    header = batch_header(
        batch,
        encoded,
        session=session,
        participant_id=participant_id,
        sequence=sequence,
        cursor=cursor,
    )
    return StoredBatch(header=header, block=encoded.block, data=encoded.data)


def _reencoded(stored: StoredBatch, batch: ExperienceBatch, *, codec: int) -> StoredBatch:
    """batch (rows of stored) encoded in codec, under stored's sender, sequence and cursor."""
    return _encoded(
        batch,
        session=stored.header.session,
        participant_id=stored.header.participant_id,
        sequence=stored.header.sequence,
        cursor=stored.header.cursor,
        codec=codec,
    )
