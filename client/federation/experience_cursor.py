"""Where the next pull of other participants' experience starts, kept across restarts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from fedrl.common.durable_files import write_atomically

log = logging.getLogger(__name__)


class CursorFile:
    """The cursor of one session in a small JSON file.

    Losing it costs only duplicates of foreign transitions already seen (the
    server starts over from its oldest batch), so a damaged file is reported
    and read as 0 rather than stopping the participant.
    """

    def __init__(self, path: Path) -> None:
        self._path = path

    def load(self) -> int:
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
            cursor = data["cursor"]
            if not isinstance(cursor, int) or cursor < 0:
                raise ValueError(f"cursor {cursor!r} is not a non-negative integer")
        except FileNotFoundError:
            return 0
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("experience cursor %s is unreadable (%s); starting from 0", self._path, exc)
            return 0
        return cursor

    def save(self, cursor: int) -> None:
        """Replace the file durably: a crash leaves the old cursor or the new one."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"cursor": cursor}).encode("utf-8")
        write_atomically(self._path, lambda file: file.write(data))
