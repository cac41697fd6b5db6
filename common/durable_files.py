"""Files that survive a crash or a power loss: atomic replacement and durable directory entries.

Client and server both keep state that must be either the old or the new
version after `kill -9` (sync state, autosaves, outbox entries, checkpoints,
logs). On POSIX that takes three steps: write a temporary file and fsync it,
rename it over the target, then fsync the folder, which holds the names.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def fsync_directory(directory: Path) -> None:
    """Make creations, renames and deletions in `directory` survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Replace `path` with what `write` puts into the open file: a crash leaves old or new.

    The temporary file is `.<name>.tmp` beside the target, so a leftover from
    a crash is overwritten by the next write rather than piling up.
    """
    temp = path.with_name(f".{path.name}.tmp")
    with open(temp, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)
    fsync_directory(path.parent)
