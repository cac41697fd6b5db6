"""What every part of the server names the same way: its files, sessions, participants, the clock.

Under the data dir: the state database (DB_FILE), global_state.json, the
versions' metrics.jsonl, TensorBoard runs, and one folder per session
(session_dir) holding its update log, checkpoints, experience and
population files. Session names follow the participant id rules, because
each names a folder too.
"""

from __future__ import annotations

import time
from pathlib import Path

from fedrl.common.identity import safe_dirname, validate_participant_id
from fedrl.server.refusals import InvalidRequestError

DB_FILE = "state.sqlite3"
GLOBAL_STATE_FILE = "global_state.json"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
"""Under the data dir: one TensorBoard run per session (with --tensorboard)."""
SESSIONS_DIR = "sessions"
DEFAULT_SESSION = "default"


def session_dir(data_dir: Path, session: str) -> Path:
    """The folder of one session's files under the data dir."""
    return data_dir / SESSIONS_DIR / safe_dirname(session)


def validate_id(raw: str) -> str:
    """A participant id as the server keeps it; InvalidRequestError naming the rule if not."""
    try:
        return validate_participant_id(raw)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


def validate_session_name(raw: str) -> str:
    """A session name ('' is the default session), under the participant id rules."""
    try:
        return validate_participant_id(raw or DEFAULT_SESSION)
    except ValueError as exc:
        raise InvalidRequestError(str(exc).replace("participant id", "session name")) from None


def now_ms() -> int:
    """The server's clock: milliseconds since the Unix epoch, as every stored time is."""
    return int(time.time() * 1000)
