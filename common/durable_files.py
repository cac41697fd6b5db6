"""Files that survive a crash or a power loss: atomic replacement and durable directory entries.

Client and server both keep state that must be either the old or the new
version after `kill -9` (sync state, autosaves, outbox entries, checkpoints,
status files, keys, exported models). On POSIX that takes three steps: write
a temporary file and fsync it, rename it over the target, then fsync the
folder, which holds the names.

Temporary names. A path with one writer at a time uses `.<name>.tmp`: a
leftover of a crash is replaced by the next write rather than piling up.
Writers that may overlap (two threads rewriting one status file, two stores
on one checkpoint folder) ask for a unique name, `.<name>.<pid>.<random>.tmp`;
the pid lets remove_abandoned_temp_files tell a dead writer's leftover from
a write under way.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_UNIQUE_TEMP = re.compile(r"\.(?P<target>.+)\.(?P<pid>\d+)\.[0-9a-f]+\.tmp")

# Unique temporary files this process is writing: a cleaner in this process
# (another store on the same folder, say) must not take them for leftovers.
_in_flight: set[Path] = set()
_in_flight_lock = threading.Lock()


def fsync_directory(directory: Path) -> None:
    """Make creations, renames and deletions in `directory` survive a power loss."""
    _fsync(directory)


def datasync(fd: int) -> None:
    """fdatasync where the platform has it (it skips the mtime update), else fsync."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    sync(fd)


def write_all(fd: int, data: bytes, offset: int) -> None:
    """pwrite until every byte is written (a regular file may take fewer at once)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def lock_directory(lock_file: Path) -> int:
    """An open descriptor holding an exclusive flock on `lock_file` (created if missing).

    For a folder with one writer at a time: a second one gets BlockingIOError
    instead of interleaving its writes. The kernel releases the lock when its
    holder dies, kill -9 included; closing the descriptor releases it too.
    """
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    return fd


@contextmanager
def replacing(path: Path, *, mode: int | None = None, unique: bool = False) -> Iterator[Path]:
    """A temporary file beside `path` to write; a clean exit puts it in place, durably.

    The file exists, empty, when the block starts: the block writes it
    through its own open, or hands its name to a library that writes by
    name and may read it back to check it before it counts. On a clean exit
    its data is fsynced, it is renamed over `path` and the folder fsynced; on
    an exception it is deleted and `path` is left as it was.

    `mode` (e.g. 0o600 for a private key) holds from the file's creation, so
    its content is never readable more widely even for an instant; without
    it the file gets 0o666 less the umask, as open() gives. `unique` is for
    writers of one path that may overlap (see the module docstring).
    """
    temp = _unique_temp(path) if unique else path.with_name(f".{path.name}.tmp")
    if unique:
        with _in_flight_lock:
            _in_flight.add(temp)
    try:
        _create(temp, mode, fresh=not unique)
        yield temp
        # Through a descriptor of our own: what a writer by name wrote is flushed too.
        _fsync(temp)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    finally:
        if unique:
            with _in_flight_lock:
                _in_flight.discard(temp)
    fsync_directory(path.parent)


def write_atomically(
    path: Path,
    write: Callable[[BinaryIO], object],
    *,
    mode: int | None = None,
    unique: bool = False,
) -> None:
    """Replace `path` with what `write` puts into the open file: a crash leaves old or new."""
    with replacing(path, mode=mode, unique=unique) as temp, open(temp, "wb") as file:
        write(file)


def remove_abandoned_temp_files(directory: Path, target: re.Pattern[str]) -> None:
    """Delete unique temporary files for targets matching `target` whose write cannot finish.

    A file is abandoned when its writer process is gone, or is this process
    and no longer writing it; another live process's files are left alone.
    """
    with _in_flight_lock:
        for entry in directory.iterdir():
            match = _UNIQUE_TEMP.fullmatch(entry.name)
            if match and target.fullmatch(match["target"]) and _abandoned(entry, int(match["pid"])):
                entry.unlink(missing_ok=True)


def _unique_temp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")


def _create(temp: Path, mode: int | None, *, fresh: bool) -> None:
    """Create `temp` empty with `mode`; a leftover under a fixed name is removed first.

    Removed rather than truncated: a truncated leftover would keep its own,
    possibly wider, permissions.
    """
    if fresh:
        temp.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o666 if mode is None else mode)
    try:
        if mode is not None:
            # The umask may have taken bits away from what was asked for.
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _fsync(path: Path) -> None:
    """fsync a file's data or a folder's entries (Linux takes a read-only descriptor for both)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _abandoned(temp: Path, pid: int) -> bool:
    if pid == os.getpid():
        return temp not in _in_flight
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):
        return True
    except PermissionError:
        return False  # alive, under another user
    return False
