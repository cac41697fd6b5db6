"""The server's global state in SQLite: sessions, participants, versions, acks.

One writer connection, used by one thread at a time (the server runs every
call on a single-thread executor, so transactions never interleave). WAL mode
lets `fedrl-server status` read a consistent snapshot while the server writes;
synchronous=FULL makes each commit durable before it returns, because an ack
row or a version row promised to a client must survive a power cut.

The acks table is the exactly-once ledger: one row per acknowledged
(session, participant, sequence) with the answer that was sent, and the
version it was folded into once applied. Participant and session counters
move in the same transaction as the ack row, so they can never disagree.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedrl.common.group_rules import LEGACY_RULES, GroupRules
from fedrl.common.group_rules_serde import rules_from_bytes
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.storage.state_schema import SCHEMA, SCHEMA_VERSION

QUARANTINED = -1
"""acks.applied_version of an acknowledged update set aside instead of applied."""

INT64_MAX = (1 << 63) - 1
"""SQLite's largest INTEGER: where the episode and step totals stop (saturate)."""

# Other connections write this file too (the experience store's tables); a
# commit of theirs holds the write lock for milliseconds, so wait, don't fail.
BUSY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SessionRow:
    """A session as stored: fixed by its spec, with its goal and progress."""

    name: str
    spec: tpb.ModelSpec
    spec_hash: str
    goal_total: int
    episodes_done: int
    env_steps: int
    population: bool = False
    """A population-based training session (server/population/), not an averaging one."""
    rules: bytes | None = None
    """Its rules as a serialized fedrl.v1.GroupRules; None for a session created before
    sessions had rules, until a server records them (record_missing_rules)."""

    @property
    def group_rules(self) -> GroupRules:
        """Its rules; a session created before sessions had rules ran by LEGACY_RULES."""
        return LEGACY_RULES if self.rules is None else rules_from_bytes(self.rules)


@dataclass(frozen=True)
class AckRow:
    """An acknowledged update and the answer it got (replayed for duplicates)."""

    session: str
    participant_id: str
    sequence: int
    lsn: int
    base_version: int
    current_version: int
    staleness: int
    weight: float
    episodes: int
    env_steps: int
    goal_total: int
    goal_done: int
    received_ms: int
    eval_return: float | None = None
    """The local model's evaluation return, for the participant's best."""
    base_eval_return: float | None = None
    """Evaluation return of a global version, credited to that version's row."""
    evaluated_version: int | None = None
    """The version base_eval_return scores; None: the base version."""
    norm: float | None = None
    """The update's global L2 norm (the strategy's norm bound counts it)."""
    applied_version: int | None = None
    """The version this update was folded into; None while it waits in the buffer,
    QUARANTINED once it was set aside (never applied; see federation/quarantine.py)."""


@dataclass(frozen=True)
class VersionRow:
    """A committed global version; `lsn` is the newest update log entry folded in (for the record:
    recovery goes by the acks' applied_version, because acks reach the buffer out of LSN order)."""

    session: str
    version: int
    parent: int
    created_ms: int
    lsn: int
    contributors: tuple[str, ...]
    max_staleness: int
    mean_return: float | None
    checkpoint: str


class StateDB:
    """Typed access to the state database; one instance per server process."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        if read_only:
            if not path.exists():
                raise FileNotFoundError(f"no state database at {path}")
            uri = f"{path.resolve().as_uri()}?mode=ro"
            self._conn = sqlite3.connect(
                uri, uri=True, check_same_thread=False, timeout=BUSY_TIMEOUT_S
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(SCHEMA)
            self._add_ack_norms()
            self._check_schema_version()
        self._conn.execute("PRAGMA foreign_keys=ON")

    def close(self) -> None:
        self._conn.close()

    @property
    def connection(self) -> sqlite3.Connection:
        """For the parts that keep tables of their own here (the population's records) and
        for the status read model: reads."""
        return self._conn

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """For the parts that keep tables of their own here: one write transaction."""
        return self._transaction()

    def create_tables(self, schema: str) -> None:
        """Run a part's CREATE TABLE IF NOT EXISTS script: its tables live in this file too."""
        self._conn.executescript(schema)

    def has_table(self, name: str) -> bool:
        """Whether the table exists (a read-only view of an older database may lack it)."""
        row = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)
        ).fetchone()
        return row is not None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front, so a reader never
        # sees half of a multi-row change and the commit cannot deadlock.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _add_ack_norms(self) -> None:
        """acks.norm came after schema version 1 shipped: added to an older database as it
        opens (its rows have none, so the norm bound starts afresh once)."""
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(acks)")}
        if "norm" not in columns:
            self._conn.execute("ALTER TABLE acks ADD COLUMN norm REAL")

    def _check_schema_version(self) -> None:
        row = self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            with self._transaction() as db:
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
        elif int(row[0]) != SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} has schema version {row[0]}, this server reads {SCHEMA_VERSION}; "
                "use a matching fedrl-server or a fresh --data-dir"
            )

    # Server settings, so `fedrl-server status` can show them without the server.

    def save_session_config(self, config: pb.SessionConfig) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('session_config', ?)",
                (config.SerializeToString(),),
            )

    def session_config(self) -> pb.SessionConfig:
        row = self._conn.execute("SELECT value FROM meta WHERE key='session_config'").fetchone()
        return pb.SessionConfig.FromString(row[0]) if row else pb.SessionConfig()

    # Sessions.

    def sessions(self) -> list[SessionRow]:
        rows = self._conn.execute(
            "SELECT name, spec, spec_hash, goal_total, episodes_done, env_steps "
            "FROM sessions ORDER BY name"
        ).fetchall()
        populations = (
            {name for (name,) in self._conn.execute("SELECT session FROM populations")}
            if self.has_table("populations")
            else set()
        )
        rules: dict[str, bytes] = (
            dict(self._conn.execute("SELECT session, rules FROM session_rules").fetchall())
            if self.has_table("session_rules")
            else {}
        )
        return [
            SessionRow(
                name,
                tpb.ModelSpec.FromString(spec),
                spec_hash,
                goal,
                done,
                steps,
                population=name in populations,
                rules=rules.get(name),
            )
            for name, spec, spec_hash, goal, done, steps in rows
        ]

    def create_session(
        self,
        name: str,
        spec: tpb.ModelSpec,
        spec_hash: str,
        goal_total: int,
        now_ms: int,
        *,
        rules: pb.GroupRules,
        population: bool = False,
    ) -> None:
        """A new session; its rules and a population's mode are stored in the same
        transaction."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO sessions (name, spec, spec_hash, env_id, goal_total, created_ms) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (name, spec.SerializeToString(), spec_hash, spec.env_id, goal_total, now_ms),
            )
            db.execute(
                "INSERT INTO session_rules (session, rules) VALUES (?, ?)",
                (name, rules.SerializeToString()),
            )
            if population:
                db.execute(
                    "INSERT INTO populations (session, created_ms) VALUES (?, ?)", (name, now_ms)
                )

    def record_missing_rules(self, rules: pb.GroupRules) -> list[str]:
        """Give `rules` to every session that has none (created before sessions had rules);
        the sessions that got them."""
        with self._transaction() as db:
            names = [
                name
                for (name,) in db.execute(
                    "SELECT name FROM sessions WHERE name NOT IN (SELECT session FROM "
                    "session_rules) ORDER BY name"
                )
            ]
            db.executemany(
                "INSERT INTO session_rules (session, rules) VALUES (?, ?)",
                [(name, rules.SerializeToString()) for name in names],
            )
        return names

    def set_goal(self, session: str, goal_total: int) -> None:
        with self._transaction() as db:
            db.execute("UPDATE sessions SET goal_total=? WHERE name=?", (goal_total, session))

    # Participants.

    def touch_participant(
        self, session: str, participant_id: str, status: str, now_ms: int
    ) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO participants "
                "(session, participant_id, first_seen_ms, last_seen_ms, status) "
                "VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (session, participant_id) "
                "DO UPDATE SET last_seen_ms=excluded.last_seen_ms, status=excluded.status",
                (session, participant_id, now_ms, now_ms, status),
            )

    def set_participant_data(
        self, session: str, participant_id: str, source: str, synthetic: bool
    ) -> None:
        """What the participant trains on, as its Join said."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO participant_data (session, participant_id, source, synthetic) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (session, participant_id) "
                "DO UPDATE SET source=excluded.source, synthetic=excluded.synthetic",
                (session, participant_id, source, int(synthetic)),
            )

    def is_participant(self, session: str, participant_id: str) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM participants WHERE session=? AND participant_id=?",
            (session, participant_id),
        ).fetchone()
        return row is not None

    def participant_statuses(self, session: str) -> dict[str, str]:
        """Every participant that ever joined the session, with "active" or "left"."""
        rows = self._conn.execute(
            "SELECT participant_id, status FROM participants WHERE session=?", (session,)
        ).fetchall()
        return dict(rows)

    def count_rejection(self, session: str, participant_id: str, now_ms: int) -> None:
        self._bump(session, participant_id, "updates_rejected", now_ms)

    def count_duplicate(self, session: str, participant_id: str, now_ms: int) -> None:
        self._bump(session, participant_id, "updates_duplicate", now_ms)

    def _bump(self, session: str, participant_id: str, column: str, now_ms: int) -> None:
        with self._transaction() as db:
            db.execute(
                f"UPDATE participants SET {column}={column}+1, last_seen_ms=? "
                "WHERE session=? AND participant_id=?",
                (now_ms, session, participant_id),
            )

    # The exactly-once ledger.

    def last_sequences(self, session: str) -> dict[str, int]:
        rows = self._conn.execute(
            "SELECT participant_id, MAX(sequence) FROM acks WHERE session=? "
            "GROUP BY participant_id",
            (session,),
        ).fetchall()
        return {pid: int(seq) for pid, seq in rows}

    def applied_sequence(self, session: str, participant_id: str, version: int) -> int:
        """The participant's highest update sequence folded into `version` or an older one.

        Walks the participant's acks from the newest down the primary key and
        stops at the first applied one: recent acks are the ones in question.
        """
        row = self._conn.execute(
            "SELECT sequence FROM acks WHERE session=? AND participant_id=? "
            "AND applied_version IS NOT NULL AND applied_version <= ? "
            "ORDER BY sequence DESC LIMIT 1",
            (session, participant_id, version),
        ).fetchone()
        return int(row[0]) if row is not None else 0

    def find_ack(self, session: str, participant_id: str, sequence: int) -> AckRow | None:
        row = self._conn.execute(
            "SELECT lsn, base_version, current_version, staleness, weight, episodes, env_steps, "
            "goal_total, goal_done, received_ms, applied_version FROM acks "
            "WHERE session=? AND participant_id=? AND sequence=?",
            (session, participant_id, sequence),
        ).fetchone()
        if row is None:
            return None
        lsn, base, current, staleness, weight, episodes, steps, total, done, received, applied = row
        return AckRow(
            session=session,
            participant_id=participant_id,
            sequence=sequence,
            lsn=lsn,
            base_version=base,
            current_version=current,
            staleness=staleness,
            weight=weight,
            episodes=episodes,
            env_steps=steps,
            goal_total=total,
            goal_done=done,
            received_ms=received,
            applied_version=applied,
        )

    def recent_norms(self, session: str, count: int) -> list[float]:
        """The norms of the session's newest `count` acknowledged updates, oldest first."""
        rows = self._conn.execute(
            "SELECT norm FROM acks WHERE session=? AND norm IS NOT NULL "
            "ORDER BY rowid DESC LIMIT ?",
            (session, count),
        ).fetchall()
        return [float(norm) for (norm,) in reversed(rows)]

    def oldest_unapplied_lsn(self, session: str) -> int | None:
        """LSN of the oldest acknowledged update not yet in a version (the log must keep it)."""
        row = self._conn.execute(
            "SELECT MIN(lsn) FROM acks WHERE session=? AND applied_version IS NULL", (session,)
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def record_acks(self, acks: Sequence[AckRow]) -> list[AckRow | None]:
        """Store acks and move the counters with them, in one transaction (one fsync for all).

        None for an ack that was already there. Otherwise the row as stored:
        its goal fields are the session's totals right after this update
        counted, whatever the caller guessed, because concurrent pushes cannot
        know each other's episodes.
        """
        with self._transaction() as db:
            return [_insert_ack(db, ack) for ack in acks]

    # Updates set aside (server/federation/quarantine.py).

    def quarantine(
        self,
        session: str,
        *,
        lsn: int,
        participant_id: str,
        sequence: int,
        reason: str,
        now_ms: int,
        file: str,
    ) -> None:
        """Record a quarantined log record; its ack, if any, is no longer waiting to be applied."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO quarantined "
                "(session, lsn, participant_id, reason, quarantined_ms, file) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (session, lsn, participant_id, reason, now_ms, file),
            )
            # A record written before the range checks may hold a sequence no
            # ack row can: then there is no ack row to mark either.
            if 0 <= sequence <= INT64_MAX:
                db.execute(
                    "UPDATE acks SET applied_version=? WHERE session=? AND participant_id=? "
                    "AND sequence=? AND lsn=? AND applied_version IS NULL",
                    (QUARANTINED, session, participant_id, sequence, lsn),
                )

    def is_quarantined(self, session: str, lsn: int) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM quarantined WHERE session=? AND lsn=?", (session, lsn)
        ).fetchone()
        return row is not None

    def quarantined_count(self, session: str) -> int:
        if not self.has_table("quarantined"):
            # A read-only view of a database no newer server has opened yet.
            return 0
        (count,) = self._conn.execute(
            "SELECT COUNT(*) FROM quarantined WHERE session=?", (session,)
        ).fetchone()
        return int(count)

    # Versions.

    def commit_version(self, row: VersionRow, applied: Iterable[tuple[str, int]]) -> None:
        """Make a version visible and mark the acks folded into it, atomically."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO versions (session, version, parent, created_ms, lsn, contributors, "
                "max_staleness, mean_return, checkpoint) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.session,
                    row.version,
                    row.parent,
                    row.created_ms,
                    row.lsn,
                    json.dumps(list(row.contributors), ensure_ascii=False),
                    row.max_staleness,
                    row.mean_return,
                    row.checkpoint,
                ),
            )
            db.executemany(
                "UPDATE acks SET applied_version=? "
                "WHERE session=? AND participant_id=? AND sequence=?",
                [(row.version, row.session, pid, seq) for pid, seq in applied],
            )

    def latest_version(self, session: str) -> VersionRow | None:
        rows = self.version_rows(session, limit=1)
        return rows[0] if rows else None

    def best_version(self, session: str) -> tuple[int, float] | None:
        """The version with the highest mean evaluation return reported against it."""
        row = self._conn.execute(
            "SELECT version, eval_sum / eval_count FROM versions "
            "WHERE session=? AND eval_count > 0 ORDER BY eval_sum / eval_count DESC, version DESC "
            "LIMIT 1",
            (session,),
        ).fetchone()
        return (int(row[0]), float(row[1])) if row else None

    def mark_pruned(self, session: str, versions: Sequence[int]) -> None:
        with self._transaction() as db:
            db.executemany(
                "UPDATE versions SET checkpoint='' WHERE session=? AND version=?",
                [(session, v) for v in versions],
            )

    def version_rows(self, session: str, *, limit: int) -> list[VersionRow]:
        """The session's newest `limit` versions, newest first."""
        rows = self._conn.execute(
            "SELECT version, parent, created_ms, lsn, contributors, max_staleness, mean_return, "
            "checkpoint FROM versions WHERE session=? ORDER BY version DESC LIMIT ?",
            (session, limit),
        ).fetchall()
        return [
            VersionRow(session, v, parent, ms, lsn, tuple(json.loads(c)), stale, mean, ckpt)
            for v, parent, ms, lsn, c, stale, mean, ckpt in rows
        ]


def _insert_ack(db: sqlite3.Connection, ack: AckRow) -> AckRow | None:
    """Insert one ack and move the counters with it, inside the caller's transaction."""
    inserted = db.execute(
        "INSERT OR IGNORE INTO acks (session, participant_id, sequence, lsn, base_version, "
        "current_version, staleness, weight, episodes, env_steps, goal_total, goal_done, "
        "received_ms, norm) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            ack.session,
            ack.participant_id,
            ack.sequence,
            ack.lsn,
            ack.base_version,
            ack.current_version,
            ack.staleness,
            ack.weight,
            ack.episodes,
            ack.env_steps,
            ack.goal_total,
            ack.goal_done,
            ack.received_ms,
            ack.norm,
        ),
    ).rowcount
    if not inserted:
        return None
    # Totals saturate at INT64_MAX (see _SATURATED_SUM): a sum past it would
    # make SQLite store a float, and the goal arithmetic would stop being exact.
    db.execute(
        f"UPDATE participants SET episodes={_saturated_sum('episodes', 1)}, "
        f"env_steps={_saturated_sum('env_steps', 2)}, "
        "updates_accepted=updates_accepted+1, last_seen_ms=MAX(last_seen_ms, ?3), "
        "best_eval_return=CASE WHEN ?4 IS NULL THEN best_eval_return "
        "WHEN best_eval_return IS NULL OR ?4 > best_eval_return THEN ?4 "
        "ELSE best_eval_return END "
        "WHERE session=?5 AND participant_id=?6",
        (
            ack.episodes,
            ack.env_steps,
            ack.received_ms,
            ack.eval_return,
            ack.session,
            ack.participant_id,
        ),
    )
    db.execute(
        f"UPDATE sessions SET episodes_done={_saturated_sum('episodes_done', 1)}, "
        f"env_steps={_saturated_sum('env_steps', 2)} WHERE name=?3",
        (ack.episodes, ack.env_steps, ack.session),
    )
    if ack.base_eval_return is not None:
        db.execute(
            "UPDATE versions SET eval_sum=eval_sum+?, eval_count=eval_count+1 "
            "WHERE session=? AND version=?",
            (
                ack.base_eval_return,
                ack.session,
                ack.base_version if ack.evaluated_version is None else ack.evaluated_version,
            ),
        )
    total, done = db.execute(
        "SELECT goal_total, episodes_done FROM sessions WHERE name=?", (ack.session,)
    ).fetchone()
    db.execute(
        "UPDATE acks SET goal_total=?, goal_done=? "
        "WHERE session=? AND participant_id=? AND sequence=?",
        (total, done, ack.session, ack.participant_id, ack.sequence),
    )
    return dataclasses.replace(ack, goal_total=total, goal_done=done)


def _saturated_sum(column: str, parameter: int) -> str:
    """SQL for `column + ?parameter`, saturating at INT64_MAX instead of overflowing.

    Both terms are at most INT64_MAX (request_fields checks every count
    before it is logged), so INT64_MAX - ?parameter cannot overflow either.
    """
    return (
        f"CASE WHEN {column} > {INT64_MAX} - ?{parameter} THEN {INT64_MAX} "
        f"ELSE {column} + ?{parameter} END"
    )
