"""Global model versions as plain, atomically written .npz files.

File format, loadable without fedrl: ``<root>/v{version:08d}.npz`` (e.g.
``v00000012.npz``; more digits past 99,999,999) is an ordinary numpy .npz
archive: a ZIP file, stored uncompressed, with one ``<name>.npy`` entry per
tensor, in model order. So::

    archive = numpy.load("v00000012.npz")      # allow_pickle stays False
    archive.files                              # tensor names, in model order
    archive["q.0.weight"]                      # one tensor

Names are kept byte for byte (dots, slashes and any Unicode included); the
only name numpy's dict view cannot tell apart is one ending in ".npy" next to
the same name without it, which ModelStore.load still reads back correctly.
Entries carry a fixed timestamp, so the same model always gives the same bytes.
No entry is ever pickled: object arrays are refused.

Durability: a version is written to a temporary file in the same directory,
flushed, fsynced, renamed over its final name (atomic on POSIX) and the
directory fsynced, so a crash leaves either no file or the complete one.
Temporary files carry their writer's pid and are removed once that process
is gone. Versions are immutable: rewriting one with different content is
refused; rewriting identical content is a no-op, because a server restarting
after a crash may recompute the version it was writing. One writer per
directory.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from fedrl.common.durable_files import (
    fsync_directory,
    remove_abandoned_temp_files,
    write_atomically,
)

_VERSION_FILE = re.compile(r"v(\d{8,})\.npz")
# ZIP cannot store dates before 1980; any fixed date makes the bytes reproducible.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_NPY_SUFFIX = ".npy"


class ModelStore:
    """Writes, reads, lists and prunes the checkpoints of one session's global model."""

    def __init__(self, root: Path, *, keep_last: int = 5, keep_every: int = 50) -> None:
        """Open (creating it if needed) the store at `root`; removes crash leftovers."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if keep_every < 1:
            raise ValueError(f"keep_every must be >= 1, got {keep_every}")
        self._root = Path(root)
        self._keep_last = keep_last
        self._keep_every = keep_every
        self._root.mkdir(parents=True, exist_ok=True)
        self._remove_temp_files()

    @property
    def root(self) -> Path:
        """The directory holding the version files."""
        return self._root

    def path(self, version: int) -> Path:
        """Where `version` is (or would be) stored."""
        return self._root / f"v{_version(version):08d}.npz"

    def has(self, version: int) -> bool:
        """True when the checkpoint of `version` is on disk."""
        return self.path(version).is_file()

    def versions(self) -> list[int]:
        """Stored versions, ascending; temporary files left by a crash are removed."""
        self._remove_temp_files()
        found = []
        for entry in self._root.iterdir():
            match = _VERSION_FILE.fullmatch(entry.name)
            # Only canonical names: v000000012.npz is not version 12's file.
            if match and entry.name == f"v{int(match[1]):08d}.npz":
                found.append(int(match[1]))
        return sorted(found)

    def write(self, version: int, tensors: Sequence[tuple[str, np.ndarray]]) -> Path:
        """Store `version` durably and return its path; visible only once complete."""
        number = _version(version)
        items = _checked_tensors(tensors)
        target = self.path(number)
        if target.exists():
            if _same_tensors(self._read(target), items):
                return target
            raise ValueError(
                f"version {number} is already stored at {target} with different content; "
                "versions are immutable"
            )
        # A unique temporary name: another store on this folder (one listing
        # versions for a Status call, say) leaves a write under way alone.
        write_atomically(target, lambda file: _write_npz(file, items), unique=True)
        return target

    def load(self, version: int) -> list[tuple[str, np.ndarray]]:
        """The named tensors of `version`, in model order."""
        number = _version(version)
        try:
            return self._read(self.path(number))
        except FileNotFoundError:
            raise FileNotFoundError(
                f"version {number} is not in the model store at {self._root} "
                "(never written, or pruned by retention)"
            ) from None

    def retain(self, *, current: int, best: int | None) -> list[int]:
        """Delete checkpoints outside the retention set; return the deleted versions.

        Kept: the newest `keep_last` versions up to `current`, `best`, every
        version divisible by `keep_every` (0 included) and `current` itself.
        Versions above `current` are left alone (see discard_after).
        """
        newest = _version(current)
        stored = [v for v in self.versions() if v <= newest]
        keep = set(stored[-self._keep_last :]) | {newest}
        if best is not None:
            keep.add(_version(best))
        keep.update(v for v in stored if v % self._keep_every == 0)
        return self._delete(v for v in stored if v not in keep)

    def discard_after(self, current: int) -> list[int]:
        """Delete versions above `current`; return them.

        For restart: a crash between writing a checkpoint and committing its
        row leaves a file for a version that never became visible. The
        aggregator recomputes that version from the update log, possibly from
        a different set of updates, and must not find it taken.
        """
        newest = _version(current)
        return self._delete(v for v in self.versions() if v > newest)

    def discard_before(self, current: int) -> list[int]:
        """Delete versions below `current`; return them (a store that keeps only the newest)."""
        newest = _version(current)
        return self._delete(v for v in self.versions() if v < newest)

    def _delete(self, versions: Iterator[int]) -> list[int]:
        deleted = []
        for version in versions:
            self.path(version).unlink(missing_ok=True)
            deleted.append(version)
        if deleted:
            fsync_directory(self._root)
        return deleted

    def _read(self, path: Path) -> list[tuple[str, np.ndarray]]:
        return read_checkpoint(path)

    def _remove_temp_files(self) -> None:
        """Delete temporary files whose write can no longer finish."""
        remove_abandoned_temp_files(self._root, _VERSION_FILE)


def read_checkpoint(path: Path) -> list[tuple[str, np.ndarray]]:
    """The named tensors of one checkpoint file, in model order (ValueError if unreadable)."""
    try:
        with zipfile.ZipFile(path) as archive:
            tensors = []
            for info in archive.infolist():
                if not info.filename.endswith(_NPY_SUFFIX):
                    raise ValueError(f"entry {info.filename!r} is not a .npy array")
                with archive.open(info) as member:
                    array = np.lib.format.read_array(member, allow_pickle=False)
                tensors.append((info.filename[: -len(_NPY_SUFFIX)], array))
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise ValueError(f"checkpoint {path} is unreadable: {error}") from error
    return tensors


def _write_npz(file: BinaryIO, tensors: list[tuple[str, np.ndarray]]) -> None:
    """What numpy.savez writes, with a fixed timestamp and exact entry names."""
    with zipfile.ZipFile(file, mode="w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in tensors:
            info = zipfile.ZipInfo(name + _NPY_SUFFIX, date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_STORED
            # Zip64 from the start: a tensor may pass 4 GiB, and the size is
            # unknown when the entry header is written.
            with archive.open(info, mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def _checked_tensors(tensors: Sequence[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    """Refuse what the archive could not hold or give back exactly."""
    items = list(tensors)
    if not items:
        raise ValueError("a model needs at least one tensor")
    seen: set[str] = set()
    for index, (name, array) in enumerate(items):
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor {index}: name must be a non-empty string, got {name!r}")
        # ZIP entry names end at a NUL byte, and a lone surrogate cannot be UTF-8.
        if "\x00" in name:
            raise ValueError(f"tensor {index}: name {name!r} contains a NUL character")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"tensor {index}: name {name!r} is not valid Unicode") from None
        if name in seen:
            raise ValueError(f"tensor {index}: name {name!r} appears twice")
        seen.add(name)
        if not isinstance(array, np.ndarray):
            raise TypeError(f"tensor {name!r}: expected numpy.ndarray, got {type(array)}")
        if array.dtype.hasobject:
            raise ValueError(f"tensor {name!r}: object arrays cannot be stored without pickle")
    return items


def _same_tensors(a: list[tuple[str, np.ndarray]], b: list[tuple[str, np.ndarray]]) -> bool:
    """Equal names, dtypes, shapes and bytes (NaN payloads included), in order."""
    return len(a) == len(b) and all(
        name_a == name_b
        and x.dtype == y.dtype
        and x.shape == y.shape
        and np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()
        for (name_a, x), (name_b, y) in zip(a, b, strict=True)
    )


def _version(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"a version is an integer, got {value!r}")
    number = int(value)
    if number < 0:
        raise ValueError(f"a version is >= 0, got {number}")
    return number
