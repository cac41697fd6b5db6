"""The state database's tables (fedrl.server.storage.state_db), created as it opens."""

SCHEMA_VERSION = 1
"""Stored in meta; a server refuses a database of another version."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    name TEXT PRIMARY KEY,
    spec BLOB NOT NULL,
    spec_hash TEXT NOT NULL,
    env_id TEXT NOT NULL,
    goal_total INTEGER NOT NULL,
    episodes_done INTEGER NOT NULL DEFAULT 0,
    env_steps INTEGER NOT NULL DEFAULT 0,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS participants (
    session TEXT NOT NULL REFERENCES sessions(name),
    participant_id TEXT NOT NULL,
    first_seen_ms INTEGER NOT NULL,
    last_seen_ms INTEGER NOT NULL,
    status TEXT NOT NULL,
    episodes INTEGER NOT NULL DEFAULT 0,
    env_steps INTEGER NOT NULL DEFAULT 0,
    updates_accepted INTEGER NOT NULL DEFAULT 0,
    updates_rejected INTEGER NOT NULL DEFAULT 0,
    updates_duplicate INTEGER NOT NULL DEFAULT 0,
    best_eval_return REAL,
    PRIMARY KEY (session, participant_id)
);
CREATE TABLE IF NOT EXISTS versions (
    session TEXT NOT NULL REFERENCES sessions(name),
    version INTEGER NOT NULL,
    parent INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    lsn INTEGER NOT NULL,
    contributors TEXT NOT NULL,
    max_staleness INTEGER NOT NULL,
    mean_return REAL,
    eval_sum REAL NOT NULL DEFAULT 0,
    eval_count INTEGER NOT NULL DEFAULT 0,
    checkpoint TEXT NOT NULL,
    PRIMARY KEY (session, version)
);
CREATE TABLE IF NOT EXISTS acks (
    session TEXT NOT NULL REFERENCES sessions(name),
    participant_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    lsn INTEGER NOT NULL,
    base_version INTEGER NOT NULL,
    current_version INTEGER NOT NULL,
    staleness INTEGER NOT NULL,
    weight REAL NOT NULL,
    episodes INTEGER NOT NULL,
    env_steps INTEGER NOT NULL,
    goal_total INTEGER NOT NULL,
    goal_done INTEGER NOT NULL,
    received_ms INTEGER NOT NULL,
    applied_version INTEGER,
    norm REAL,
    PRIMARY KEY (session, participant_id, sequence)
);
CREATE INDEX IF NOT EXISTS acks_by_lsn ON acks (session, lsn);
CREATE TABLE IF NOT EXISTS quarantined (
    session TEXT NOT NULL REFERENCES sessions(name),
    lsn INTEGER NOT NULL,
    participant_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    quarantined_ms INTEGER NOT NULL,
    file TEXT NOT NULL,
    PRIMARY KEY (session, lsn)
);
-- Covers the env steps per version of the status view (each version's place on
-- the learning curve), so that sum reads the index alone.
CREATE INDEX IF NOT EXISTS acks_by_version ON acks (session, applied_version, env_steps);
-- The sessions created as populations (population-based training, server/population/):
-- their mode, fixed by the first Join.
CREATE TABLE IF NOT EXISTS populations (
    session TEXT PRIMARY KEY REFERENCES sessions(name),
    created_ms INTEGER NOT NULL
);
-- What each participant trains on, as its latest Join said (a trading run's
-- market, and whether its bars are synthetic).
CREATE TABLE IF NOT EXISTS participant_data (
    session TEXT NOT NULL,
    participant_id TEXT NOT NULL,
    source TEXT NOT NULL,
    synthetic INTEGER NOT NULL,
    PRIMARY KEY (session, participant_id)
);
-- Each session's rules (fedrl.common.group_rules), a serialized fedrl.v1.GroupRules,
-- fixed when the session was created.
CREATE TABLE IF NOT EXISTS session_rules (
    session TEXT PRIMARY KEY REFERENCES sessions(name),
    rules BLOB NOT NULL
);
"""
# quarantined, populations, participant_data and session_rules came after schema version 1
# shipped; CREATE TABLE IF NOT EXISTS adds them to an older database as it opens, so the
# version need not change.
