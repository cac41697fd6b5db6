"""Logged updates set aside instead of applied, kept on disk for a person to look at.

A record of the update log is quarantined when it cannot be applied:
recovery cannot acknowledge it (its numbers do not fit the state database: a
record written by a server older than the range checks of
transport/request_fields.py), its intact frame does not decode, or folding it
into a version would make the global model non-finite or fail to aggregate.
Recovery and the aggregator then go on without it, so one record never stops
a server from starting or a session from making versions.

Each record is kept in the session's ``quarantine/`` folder as
``{lsn:020d}.rec``, its payload exactly as the update log stores it
(storage/update_record.py describes the layout), beside ``{lsn:020d}.json``,
a note saying whose it was, which sequence, and why. The state database
counts it (Status: SessionState.updates_quarantined) and marks its ack row,
if any, so it is neither replayed again nor holds back the log's trimming.
The episodes it reported when acknowledged stay counted: the participant was
told so.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from fedrl.common.durable_files import write_atomically
from fedrl.server.names import now_ms, session_dir
from fedrl.server.storage.db_runner import DbRunner
from fedrl.server.storage.update_record import LoggedUpdate, UnreadableRecord, record_payload

log = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"


async def set_aside(
    db: DbRunner,
    data_dir: Path,
    session: str,
    record: LoggedUpdate | UnreadableRecord,
    reason: str,
) -> None:
    """Quarantine a logged record for good: its files kept, its row written, an error logged."""
    if isinstance(record, UnreadableRecord):
        payload, participant_id, sequence = record.payload, "", 0
    else:
        payload = record_payload(record)
        participant_id, sequence = record.participant_id, record.sequence
    note = {
        "session": session,
        "participant_id": participant_id,
        "sequence": sequence,
        "reason": reason,
        "quarantined_unix_ms": now_ms(),
    }
    folder = session_dir(data_dir, session) / QUARANTINE_DIR
    path = await asyncio.to_thread(keep, folder, record.lsn, payload, note)
    file = str(path.relative_to(data_dir))
    now = now_ms()
    await db(
        lambda state: state.quarantine(
            session,
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
        session,
        record.lsn,
        participant_id,
        sequence,
        file,
        reason,
    )


def keep(directory: Path, lsn: int, payload: bytes, note: dict[str, Any]) -> Path:
    """Write the record and its note durably; returns the record's path."""
    directory.mkdir(parents=True, exist_ok=True)
    record = directory / f"{lsn:020d}.rec"
    text = json.dumps({"lsn": lsn, **note}, ensure_ascii=False, indent=1) + "\n"
    write_atomically(record, lambda file: file.write(payload))
    write_atomically(record.with_suffix(".json"), lambda file: file.write(text.encode("utf-8")))
    return record
