"""A population session's records in the state database: members, generations, decisions.

Three tables beside the federation's, in the same database file (the
population creates them as it opens; which sessions are populations is the
state database's own populations table):

- members: one row per member: its generation and hyperparameters now, its
  score, env steps and latest report.
- member_generations: one row per generation of each member, never changed
  but for adopted_ms: generation 0 as it enrolled, then each exploit with its
  donor, the donor's report at that moment (donor_checkpoint) and the
  explored hyperparameters. Lineage and hyperparameter history are this table.
- member_scores: the member's last evaluations in its current generation,
  at most the window's (Ranking.score_window); its score is their mean.

The rule (Jaderberg et al. 2017, §3-4): a member's score is the mean of its
last few evaluations since its generation began (one evaluation of a few
episodes is noisy; older ones describe weights it has moved on from, and
those before an exploit weights it has left). A member is ready once it has
trained `ready_steps` env steps of its own since its generation began, and
is then ranked at every report that carries a new evaluation, on that
fresh score; a report without one ranks nobody. An exploit takes the
member's score away until it reports from its new generation, so neither it
nor anyone else is ranked against a score of weights it no longer has. A
member that trains slowly is ranked as often in its own env steps as a fast
one, always on its own latest evaluations.

`record_report` runs inside one write transaction: the member's new figures,
its counters into the participant's and the session's, and, when it is
ready, its ranking and an exploit decision. So a decision exists exactly when
its row is committed, and a kill at any moment leaves either the state before
the report or the state after it with its decision.

Checkpoint files are written before the transaction that names them (by
population/population.py); a file no committed row names is a leftover, and
`referenced_checkpoints` says which files the rows still need.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from fedrl.common.hyperparameters import explore
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.population.exploit_explore import Verdict, decision_seed, judge
from fedrl.server.storage.state_db import INT64_MAX

SCHEMA = """
CREATE TABLE IF NOT EXISTS members (
    session TEXT NOT NULL REFERENCES sessions(name),
    participant_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    hyperparameters TEXT NOT NULL,
    score REAL,
    env_steps INTEGER NOT NULL DEFAULT 0,
    episodes INTEGER NOT NULL DEFAULT 0,
    rankings INTEGER NOT NULL DEFAULT 0,
    last_sequence INTEGER NOT NULL DEFAULT 0,
    checkpoint TEXT NOT NULL DEFAULT '',
    reported_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session, participant_id)
);
CREATE TABLE IF NOT EXISTS member_generations (
    session TEXT NOT NULL REFERENCES sessions(name),
    participant_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    hyperparameters TEXT NOT NULL,
    donor TEXT NOT NULL DEFAULT '',
    donor_generation INTEGER NOT NULL DEFAULT 0,
    donor_score REAL,
    score REAL,
    donor_checkpoint TEXT NOT NULL DEFAULT '',
    env_steps INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    adopted_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session, participant_id, generation)
);
CREATE TABLE IF NOT EXISTS member_scores (
    session TEXT NOT NULL REFERENCES sessions(name),
    participant_id TEXT NOT NULL,
    generation INTEGER NOT NULL,
    sequence INTEGER NOT NULL,
    score REAL NOT NULL,
    PRIMARY KEY (session, participant_id, sequence)
);
"""


class NotEnrolledError(LookupError):
    """A report or pull from a participant that never enrolled in the population."""


@dataclass(frozen=True)
class Assignment:
    """Where a member stands (MemberAssignment on the wire)."""

    generation: int
    hyperparameters: dict[str, float]
    adopt: bool
    """The member has not reported from this generation yet: it must copy the donor."""
    donor: str
    donor_generation: int
    last_sequence: int


@dataclass(frozen=True)
class MemberReport:
    """One report as the domain has checked it; its checkpoint file is already written."""

    session: str
    participant_id: str
    sequence: int
    generation: int
    env_steps: int
    episodes: int
    score: float | None
    checkpoint: str
    """The written file, relative to the data dir."""
    now_ms: int


@dataclass(frozen=True)
class Ranking:
    """The server's population-based training settings."""

    ready_steps: int
    """Env steps of its own a member trains in a generation before its reports rank it."""
    quantile: float
    resample_probability: float
    score_window: int
    """Evaluations of its current generation a member's score averages."""


@dataclass(frozen=True)
class ReportOutcome:
    """What a report changed, and what the caller does after the commit."""

    duplicate: bool
    """Taken before (sequence at or below the last): nothing changed."""
    stale: bool
    """Trained in a generation the member has left: counted nowhere, its model not kept."""
    assignment: Assignment
    verdict: Verdict | None
    """The ranking this report triggered, if the member was ready."""
    released: tuple[str, ...]
    """Checkpoint files no row needs any more (the caller deletes them)."""
    goal_total: int
    goal_done: int


def enroll(
    conn: sqlite3.Connection,
    session: str,
    participant_id: str,
    hyperparameters: Mapping[str, float],
    now_ms: int,
) -> Assignment:
    """A new member at generation 0 with its hyperparameters; a known one keeps its own."""
    known = assignment(conn, session, participant_id)
    if known is not None:
        return known
    values = json.dumps(dict(sorted(hyperparameters.items())))
    conn.execute(
        "INSERT INTO members (session, participant_id, generation, hyperparameters) "
        "VALUES (?, ?, 0, ?)",
        (session, participant_id, values),
    )
    conn.execute(
        "INSERT INTO member_generations (session, participant_id, generation, hyperparameters, "
        "env_steps, created_ms, adopted_ms) VALUES (?, ?, 0, ?, 0, ?, ?)",
        (session, participant_id, values, now_ms, now_ms),
    )
    found = assignment(conn, session, participant_id)
    assert found is not None
    return found


def assignment(conn: sqlite3.Connection, session: str, participant_id: str) -> Assignment | None:
    row = conn.execute(
        "SELECT m.generation, m.hyperparameters, m.last_sequence, g.donor, g.donor_generation, "
        "g.adopted_ms FROM members m JOIN member_generations g ON g.session=m.session "
        "AND g.participant_id=m.participant_id AND g.generation=m.generation "
        "WHERE m.session=? AND m.participant_id=?",
        (session, participant_id),
    ).fetchone()
    if row is None:
        return None
    generation, values, last_sequence, donor, donor_generation, adopted_ms = row
    return Assignment(
        generation=generation,
        hyperparameters=json.loads(values),
        adopt=generation > 0 and adopted_ms == 0,
        donor=donor,
        donor_generation=donor_generation,
        last_sequence=last_sequence,
    )


def record_report(
    conn: sqlite3.Connection, report: MemberReport, ranking: Ranking
) -> ReportOutcome:
    """Take one report inside the caller's transaction (module docstring)."""
    session, pid = report.session, report.participant_id
    row = conn.execute(
        "SELECT generation, env_steps, episodes, rankings, last_sequence, checkpoint "
        "FROM members WHERE session=? AND participant_id=?",
        (session, pid),
    ).fetchone()
    if row is None:
        raise NotEnrolledError(f"{pid} has not enrolled in population {session!r}")
    generation, env_steps, episodes, rankings, last_sequence, old_file = row
    if report.generation > generation:
        raise ValueError(
            f"generation {report.generation} is ahead of the server's {generation} for {pid}"
        )
    if report.sequence <= last_sequence or report.generation < generation:
        return _unchanged(
            conn, report, duplicate=report.sequence <= last_sequence, released=(report.checkpoint,)
        )
    now = report.now_ms
    adopted = conn.execute(
        "UPDATE member_generations SET adopted_ms=? WHERE session=? AND participant_id=? "
        "AND generation=? AND adopted_ms=0",
        (now, session, pid, generation),
    ).rowcount
    donor_file, generation_start = conn.execute(
        "SELECT donor_checkpoint, env_steps FROM member_generations WHERE session=? AND "
        "participant_id=? AND generation=?",
        (session, pid, generation),
    ).fetchone()
    adopted_donor_file = donor_file if adopted else ""
    new_steps = max(env_steps, report.env_steps)
    new_episodes = max(episodes, report.episodes)
    _count(conn, report, episodes=new_episodes - episodes, env_steps=new_steps - env_steps)
    score = _take_score(conn, report, window=ranking.score_window)
    conn.execute(
        "UPDATE members SET score=?, env_steps=?, episodes=?, last_sequence=?, checkpoint=?, "
        "reported_ms=? WHERE session=? AND participant_id=?",
        (score, new_steps, new_episodes, report.sequence, report.checkpoint, now, session, pid),
    )
    verdict = None
    if report.score is not None and new_steps - generation_start >= ranking.ready_steps:
        verdict = _rank(
            conn, report, rankings=rankings, env_steps=new_steps, score=score, ranking=ranking
        )
    released = tuple(
        path
        for path in {old_file, adopted_donor_file} - {""}
        if path not in referenced_checkpoints(conn, session)
    )
    found = assignment(conn, session, pid)
    assert found is not None
    total, done = _goal(conn, session)
    return ReportOutcome(
        duplicate=False,
        stale=False,
        assignment=found,
        verdict=verdict,
        released=released,
        goal_total=total,
        goal_done=done,
    )


def _take_score(conn: sqlite3.Connection, report: MemberReport, *, window: int) -> float | None:
    """Add the report's evaluation to the member's window; the window's mean (None if empty)."""
    session, pid = report.session, report.participant_id
    if report.score is not None:
        conn.execute(
            "INSERT INTO member_scores (session, participant_id, generation, sequence, score) "
            "VALUES (?, ?, ?, ?, ?)",
            (session, pid, report.generation, report.sequence, report.score),
        )
        conn.execute(
            "DELETE FROM member_scores WHERE session=? AND participant_id=? AND sequence NOT IN "
            "(SELECT sequence FROM member_scores WHERE session=? AND participant_id=? "
            "ORDER BY sequence DESC LIMIT ?)",
            (session, pid, session, pid, window),
        )
    (mean,) = conn.execute(
        "SELECT AVG(score) FROM member_scores WHERE session=? AND participant_id=? "
        "AND generation=?",
        (session, pid, report.generation),
    ).fetchone()
    return None if mean is None else float(mean)


def _rank(
    conn: sqlite3.Connection,
    report: MemberReport,
    *,
    rankings: int,
    env_steps: int,
    score: float | None,
    ranking: Ranking,
) -> Verdict:
    """Rank the member among the active members; on exploit, its next generation's row."""
    session, pid = report.session, report.participant_id
    scores: dict[str, float | None] = dict(
        conn.execute(
            "SELECT m.participant_id, m.score FROM members m JOIN participants p "
            "ON p.session=m.session AND p.participant_id=m.participant_id "
            "WHERE m.session=? AND p.status='active'",
            (session,),
        ).fetchall()
    )
    scores[pid] = score
    rng = random.Random(decision_seed(session, pid, rankings))
    verdict = judge(pid, scores, quantile=ranking.quantile, rng=rng)
    conn.execute(
        "UPDATE members SET rankings=rankings+1 WHERE session=? AND participant_id=?",
        (session, pid),
    )
    if verdict.decision != "exploit":
        return verdict
    donor = verdict.donor
    assert donor is not None
    donor_generation, donor_values, donor_score, donor_file = conn.execute(
        "SELECT generation, hyperparameters, score, checkpoint FROM members "
        "WHERE session=? AND participant_id=?",
        (session, donor),
    ).fetchone()
    explored = explore(
        json.loads(donor_values), rng, resample_probability=ranking.resample_probability
    )
    values = json.dumps(explored)
    (generation,) = conn.execute(
        "SELECT generation FROM members WHERE session=? AND participant_id=?", (session, pid)
    ).fetchone()
    conn.execute(
        "INSERT INTO member_generations (session, participant_id, generation, hyperparameters, "
        "donor, donor_generation, donor_score, score, donor_checkpoint, env_steps, created_ms) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            session,
            pid,
            generation + 1,
            values,
            donor,
            donor_generation,
            donor_score,
            score,
            donor_file,
            env_steps,
            report.now_ms,
        ),
    )
    # The scores so far describe weights the member is about to leave.
    conn.execute(
        "UPDATE members SET generation=?, hyperparameters=?, score=NULL "
        "WHERE session=? AND participant_id=?",
        (generation + 1, values, session, pid),
    )
    conn.execute("DELETE FROM member_scores WHERE session=? AND participant_id=?", (session, pid))
    return verdict


def _count(
    conn: sqlite3.Connection, report: MemberReport, *, episodes: int, env_steps: int
) -> None:
    """The report's new episodes and steps into the participant's and the session's totals."""
    session, pid, now_ms = report.session, report.participant_id, report.now_ms
    for table, key, done_column in (
        ("participants", "session=? AND participant_id=?", "episodes"),
        ("sessions", "name=?", "episodes_done"),
    ):
        params = (session, pid) if table == "participants" else (session,)
        done, steps = conn.execute(
            f"SELECT {done_column}, env_steps FROM {table} WHERE {key}", params
        ).fetchone()
        conn.execute(
            f"UPDATE {table} SET {done_column}=?, env_steps=? WHERE {key}",
            (min(INT64_MAX, done + episodes), min(INT64_MAX, steps + env_steps), *params),
        )
    conn.execute(
        "UPDATE participants SET updates_accepted=updates_accepted+1, "
        "last_seen_ms=MAX(last_seen_ms, ?), best_eval_return=CASE WHEN ? IS NULL "
        "THEN best_eval_return WHEN best_eval_return IS NULL OR ? > best_eval_return THEN ? "
        "ELSE best_eval_return END WHERE session=? AND participant_id=?",
        (now_ms, report.score, report.score, report.score, session, pid),
    )


def _unchanged(
    conn: sqlite3.Connection, report: MemberReport, *, duplicate: bool, released: tuple[str, ...]
) -> ReportOutcome:
    found = assignment(conn, report.session, report.participant_id)
    assert found is not None
    kept = referenced_checkpoints(conn, report.session)
    total, done = _goal(conn, report.session)
    return ReportOutcome(
        duplicate=duplicate,
        stale=not duplicate,
        assignment=found,
        verdict=None,
        released=tuple(path for path in released if path and path not in kept),
        goal_total=total,
        goal_done=done,
    )


def _goal(conn: sqlite3.Connection, session: str) -> tuple[int, int]:
    total, done = conn.execute(
        "SELECT goal_total, episodes_done FROM sessions WHERE name=?", (session,)
    ).fetchone()
    return int(total), int(done)


def referenced_checkpoints(conn: sqlite3.Connection, session: str) -> set[str]:
    """Files the rows still need: every member's latest, every unadopted exploit's donor model."""
    latest = conn.execute(
        "SELECT checkpoint FROM members WHERE session=? AND checkpoint != ''", (session,)
    )
    donors = conn.execute(
        "SELECT donor_checkpoint FROM member_generations WHERE session=? AND adopted_ms=0 "
        "AND donor_checkpoint != ''",
        (session,),
    )
    return {path for (path,) in latest} | {path for (path,) in donors}


def donor_checkpoint(
    conn: sqlite3.Connection, session: str, participant_id: str, generation: int
) -> str | None:
    """The donor model a member's generation starts from; None for generation 0 or none such."""
    row = conn.execute(
        "SELECT donor_checkpoint FROM member_generations WHERE session=? AND participant_id=? "
        "AND generation=?",
        (session, participant_id, generation),
    ).fetchone()
    return row[0] if row and row[0] else None


def describe(conn: sqlite3.Connection, session: str, state: pb.SessionState) -> None:
    """The members and their lineage into a session's status."""
    if not _has_table(conn, "members"):
        return
    members = _named_rows(
        conn,
        "SELECT m.participant_id, m.generation, m.hyperparameters, m.score, m.env_steps, "
        "m.episodes, m.rankings, m.checkpoint, m.reported_ms, g.adopted_ms "
        "FROM members m JOIN member_generations g ON g.session=m.session "
        "AND g.participant_id=m.participant_id AND g.generation=m.generation "
        "WHERE m.session=? ORDER BY m.score IS NULL, m.score DESC, m.participant_id",
        (session,),
    )
    for row in members:
        member = state.members.add(
            participant_id=row["participant_id"],
            generation=row["generation"],
            hyperparameters=json.loads(row["hyperparameters"]),
            env_steps=row["env_steps"],
            episodes=row["episodes"],
            rankings=row["rankings"],
            checkpoint=row["checkpoint"],
            last_report_unix_ms=row["reported_ms"],
            adopting=row["generation"] > 0 and row["adopted_ms"] == 0,
        )
        if row["score"] is not None:
            member.score = row["score"]
    generations = _named_rows(
        conn,
        "SELECT participant_id, generation, hyperparameters, donor, donor_generation, "
        "donor_score, score, env_steps, created_ms, adopted_ms FROM member_generations "
        "WHERE session=? ORDER BY created_ms, participant_id, generation",
        (session,),
    )
    for row in generations:
        entry = state.lineage.add(
            participant_id=row["participant_id"],
            generation=row["generation"],
            hyperparameters=json.loads(row["hyperparameters"]),
            donor=row["donor"],
            donor_generation=row["donor_generation"],
            env_steps=row["env_steps"],
            created_unix_ms=row["created_ms"],
            adopted_unix_ms=row["adopted_ms"],
        )
        if row["donor_score"] is not None:
            entry.donor_score = row["donor_score"]
        if row["score"] is not None:
            entry.score = row["score"]


def _named_rows(
    conn: sqlite3.Connection, sql: str, params: tuple[object, ...]
) -> list[sqlite3.Row]:
    """The rows of a query, read by column name, so that a long SELECT list and the code
    reading it cannot drift out of order."""
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    return cursor.execute(sql, params).fetchall()


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)
    ).fetchone()
    return row is not None
