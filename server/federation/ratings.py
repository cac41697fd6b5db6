"""Two-player games' ratings in the state database: what each participant last reported.

One table beside the federation's (created as the server opens): a row per
(session, participant, player name) with the Elo rating that participant
gives the player, the games it played against it, and when it said so. A
report replaces the participant's rows of the players it names, in one
transaction; each participant keeps at most MAX_PER_PARTICIPANT rows (its
oldest reports go first), so no client can grow the table without bound.

Participants rate on one scale (the uniform random player is 0 for all), so
a global version's rating in Status is the games-weighted mean of the
ratings its raters give it (`version_ratings`).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.refusals import InvalidRequestError
from fedrl.server.storage.state_db import INT64_MAX

SCHEMA = """
CREATE TABLE IF NOT EXISTS ratings (
    session TEXT NOT NULL REFERENCES sessions(name),
    participant_id TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    version INTEGER NOT NULL,
    rating REAL NOT NULL,
    games INTEGER NOT NULL,
    reported_ms INTEGER NOT NULL,
    PRIMARY KEY (session, participant_id, name)
);
"""

KINDS = frozenset({"latest", "baseline", "snapshot", "version"})
MAX_REPORT = 1024
"""Ratings one report may carry."""
MAX_PER_PARTICIPANT = 1024
"""Rows one participant keeps in a session."""
MAX_NAME = 64
RATING_BOUND = 1e6
"""Largest |rating| accepted: Elo ratings of any real game lie within a few thousand."""


@dataclass(frozen=True)
class Reported:
    """One rating of a report, checked."""

    kind: str
    name: str
    version: int
    rating: float
    games: int


def checked(ratings: Sequence[pb.PlayerRating]) -> list[Reported]:
    """The report's ratings, or InvalidRequestError naming the first that is out of range."""
    if len(ratings) > MAX_REPORT:
        raise InvalidRequestError(
            f"RatingsReport carries {len(ratings)} ratings; at most {MAX_REPORT} are accepted"
        )
    found: dict[str, Reported] = {}
    for index, item in enumerate(ratings):
        where = f"RatingsReport.ratings[{index}]"
        if item.kind not in KINDS:
            raise InvalidRequestError(f"{where}.kind is {item.kind!r}; one of {sorted(KINDS)}")
        if not 1 <= len(item.name) <= MAX_NAME or not item.name.isprintable():
            raise InvalidRequestError(f"{where}.name must be 1..{MAX_NAME} printable characters")
        if (item.kind == "version") != (item.version >= 0) or item.version < -1:
            raise InvalidRequestError(
                f"{where}.version is {item.version}: a version number for kind version, "
                "-1 for any other kind"
            )
        if not (math.isfinite(item.rating) and abs(item.rating) <= RATING_BOUND):
            raise InvalidRequestError(
                f"{where}.rating is {item.rating}; it must be finite and at most "
                f"{RATING_BOUND:g} in magnitude"
            )
        if item.games > INT64_MAX:
            raise InvalidRequestError(f"{where}.games is {item.games}; at most {INT64_MAX}")
        found[item.name] = Reported(item.kind, item.name, item.version, item.rating, item.games)
    return list(found.values())


def record(
    db: sqlite3.Connection,
    session: str,
    participant_id: str,
    ratings: Sequence[Reported],
    now_ms: int,
) -> None:
    """Replace the participant's rows of these players; call inside a write transaction."""
    db.executemany(
        "INSERT INTO ratings (session, participant_id, name, kind, version, rating, games, "
        "reported_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (session, participant_id, name) DO UPDATE SET kind=excluded.kind, "
        "version=excluded.version, rating=excluded.rating, games=excluded.games, "
        "reported_ms=excluded.reported_ms",
        [
            (session, participant_id, r.name, r.kind, r.version, r.rating, r.games, now_ms)
            for r in ratings
        ],
    )
    db.execute(
        "DELETE FROM ratings WHERE session=?1 AND participant_id=?2 AND name NOT IN ("
        "SELECT name FROM ratings WHERE session=?1 AND participant_id=?2 "
        "ORDER BY reported_ms DESC, name LIMIT ?3)",
        (session, participant_id, MAX_PER_PARTICIPANT),
    )


def describe(db: sqlite3.Connection, session: str, state: pb.SessionState) -> None:
    """Every rating of the session into `state.ratings`, by participant, kind and name."""
    if not _has_table(db):
        return
    rows = db.execute(
        "SELECT participant_id, kind, name, version, rating, games, reported_ms FROM ratings "
        "WHERE session=? ORDER BY participant_id, kind, version, name",
        (session,),
    ).fetchall()
    for pid, kind, name, version, rating, games, reported in rows:
        state.ratings.add(
            participant_id=pid,
            kind=kind,
            name=name,
            version=version,
            rating=rating,
            games=games,
            reported_unix_ms=reported,
        )


def version_ratings(db: sqlite3.Connection, session: str) -> dict[int, tuple[float, int]]:
    """Each rated version's games-weighted mean rating over its raters, and their games."""
    if not _has_table(db):
        return {}
    rows = db.execute(
        "SELECT version, SUM(rating * MAX(games, 1)) / SUM(MAX(games, 1)), SUM(games) "
        "FROM ratings WHERE session=? AND kind='version' GROUP BY version",
        (session,),
    ).fetchall()
    return {int(v): (float(r), int(g)) for v, r, g in rows}


def _has_table(db: sqlite3.Connection) -> bool:
    """A read-only view of a database written before ratings existed has no table."""
    found = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='ratings'")
    return found.fetchone() is not None
