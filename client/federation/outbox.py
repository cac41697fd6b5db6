"""The durable outbox: what a participant has produced but the server has not acknowledged.

Every update and every experience batch is written here BEFORE
its first send attempt and deleted only after the server's acknowledgement,
so a crash or an outage on either side loses nothing; because each entry
keeps the sequence number it was built with, a resend after a restart is
recognised by the server as a duplicate and never applied twice.

Layout of the outbox directory (one per participant state dir):

    update.sequence              last sequence allocated for kind "update"
    update-00000000000000000007.ready    never handed to the network
    update-00000000000000000006.sent     a send may have started
    quarantine/                  entries that failed their checks, kept for a human
    rejected/                    entries the server refused for good, kept for a human
    returned/                    entries refused as they stand (too stale), until their
                                 writer has put their content into a new entry

Sequences are per kind, strictly increasing forever and never reused: the
counter file is written (temp file, fsync, rename, directory fsync) before the
entry that uses the number, a restart continues after max(counter, highest
entry), and `observe_acknowledged` lifts it past what the server acknowledged
(Join's last_update_sequence) in case local state was lost.

Each entry is one file (fedrl.client.federation.outbox_file: its format, and
why a crash leaves either the whole entry or nothing).

An entry is ".ready" until the sender takes it; `next_to_send` renames it to
".sent" (durably) before the caller starts the first attempt, so after a
crash we still know it may have reached the server. Entries are sent one at a
time in sequence order, so at most the head is ".sent". A refused entry is
never resent: it goes to rejected/ when the request itself is bad, and to
returned/ when only its base version is too old, so that the sync loop can
put its progress into its next update (`give_back`, `returned`,
`forget_returned`).

Bound and merge rule. When a kind holds more than `max_entries` entries or
`max_bytes` bytes, the oldest ADJACENT pair of ".ready" entries is merged into
one by the kind's merger (update entries: fedrl.client.federation.update_entries,
whose merge sums two incremental deltas into the one update a push covering
both stretches of training would have carried). A ".sent" entry is never
merged or changed: the server may already hold it. Nor is the entry just
added: its writer has not recorded it yet (see
fedrl.client.federation.weight_sync). Every merge is logged with the
sequences it joined; nothing is dropped. The same merge joins a backlog at
send time: `next_to_send` first merges the never-attempted entries that
follow a never-attempted head, so after an outage the backlog leaves as one
update with the staleness of its oldest base, rather than as a train of
updates that each move the global version on until the last ones are refused
as too stale.

A merge writes the merged entry over the earlier one with "merged_through"
naming the later sequence, then deletes the later file; a crash between the
two leaves a ".ready" entry inside an earlier entry's merged range, which the
next open deletes (with a log line) instead of sending it twice.

Kinds without a merge function (experience batches) are bounded by dropping
their oldest ".ready" entry with a warning naming its sequence: a batch of
transitions is a sample of experience, not a contribution the session counts.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fedrl.client.federation.outbox_file import (
    KINDS,
    READY,
    SENT,
    SEQUENCE_DIGITS,
    Entry,
    OutboxError,
    check_kind,
    encode_entry,
    entry_name,
    read_entry,
    sequence_from_name,
)
from fedrl.client.federation.update_entries import UPDATE, merge_updates
from fedrl.common.durable_files import fsync_directory, write_atomically

log = logging.getLogger(__name__)

QUARANTINE, REJECTED, RETURNED = "quarantine", "rejected", "returned"

Merger = Callable[[Sequence[bytes], Sequence[bytes]], list[bytes]]
"""Combines two consecutive entries' messages into one entry's, keeping the first's sequence."""


@dataclass(frozen=True)
class OutboxLimits:
    """How much unacknowledged work one kind may hold before entries are merged."""

    max_entries: int = 20
    """Entries per kind: 20 syncs of 10 episodes is a long outage for a CartPole run."""
    max_bytes: int = 256 << 20
    """Bytes per kind on disk: 20 bfloat16 deltas of a 3M-parameter network, with room."""

    def __post_init__(self) -> None:
        # Merging needs a pair of ready entries besides a possibly sent head.
        if self.max_entries < 3:
            raise ValueError(f"outbox max_entries must be at least 3, got {self.max_entries}")
        if self.max_bytes <= 0:
            raise ValueError(f"outbox max_bytes must be positive, got {self.max_bytes}")


class Outbox:
    """Durable, bounded queues of unacknowledged messages, one per kind.

    Thread-safe: a sync thread may send while the training thread adds.
    """

    def __init__(
        self,
        root: Path,
        *,
        limits: OutboxLimits = OutboxLimits(),
        mergers: Mapping[str, Merger] | None = None,
    ) -> None:
        self._root = root
        self._limits = limits
        self._mergers = dict(mergers) if mergers is not None else {UPDATE: merge_updates}
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        self._entries: dict[str, list[Entry]] = {kind: [] for kind in KINDS}
        self._last: dict[str, int] = {kind: self._read_counter(kind) for kind in KINDS}
        self._recover()

    # Allocation and writing.

    def add(self, kind: str, build: Callable[[int], Sequence[bytes]]) -> Entry:
        """Allocate the next sequence, build the messages with it, store them durably.

        Returns the stored entry, after enforcing the bound, which may merge
        older entries but never the new one.
        """
        check_kind(kind)
        with self._lock:
            sequence = self._last[kind] + 1
            self._write_counter(kind, sequence)
            messages = tuple(build(sequence))
            entry = self._write(kind, sequence, messages, merged_through=sequence)
            self._entries[kind].append(entry)
            self._enforce_bound(kind)
            return entry

    def observe_acknowledged(self, kind: str, sequence: int) -> None:
        """Never allocate at or below `sequence` (the server's last acknowledged, from Join)."""
        check_kind(kind)
        with self._lock:
            if sequence > self._last[kind]:
                log.warning(
                    "server acknowledged %s sequence %d, beyond the local counter %d "
                    "(local state was lost or restored from a backup); continuing after it",
                    kind,
                    sequence,
                    self._last[kind],
                )
                self._write_counter(kind, sequence)

    # Sending.

    def pending(self, kind: str) -> list[Entry]:
        """Unacknowledged entries of a kind, oldest first."""
        check_kind(kind)
        with self._lock:
            return list(self._entries[kind])

    def next_to_send(self, kind: str, *, through: int | None = None) -> Entry | None:
        """The oldest entry, durably marked as attempted; send it next (again, if it was).

        Only entries whose sequences are all at most `through` (default: all)
        are considered. When the head was never attempted, the never-attempted
        entries after it are merged into it first: a backlog left by an outage
        goes out as one update whose staleness is that of its oldest base,
        instead of as many updates that each push the version further ahead of
        the ones still waiting, until the last are refused as too stale.
        """
        check_kind(kind)
        limit = math.inf if through is None else through
        with self._lock:
            entries = self._entries[kind]
            if not entries or entries[0].merged_through > limit:
                return None
            merger = self._mergers.get(kind)
            if not entries[0].attempted and merger is not None:
                while (
                    len(entries) > 1
                    and not entries[1].attempted
                    and entries[1].merged_through <= limit
                ):
                    self._merge(kind, 0, merger, why="to send a backlog as one update")
            head = entries[0]
            if not head.attempted:
                os.replace(self._path(head, READY), self._path(head, SENT))
                fsync_directory(self._root)
                head = replace(head, attempted=True)
                entries[0] = head
            return head

    def acknowledge(self, kind: str, sequence: int) -> None:
        """The server holds this entry durably: delete it."""
        with self._lock:
            entry = self._take(kind, sequence)
            self._path(entry).unlink()
            fsync_directory(self._root)

    def reject(self, kind: str, sequence: int, reason: str) -> None:
        """The server refused this entry for good: keep it in rejected/ and say so."""
        with self._lock:
            entry = self._take(kind, sequence)
            target = self._root / REJECTED
            target.mkdir(exist_ok=True)
            os.replace(self._path(entry), target / self._path(entry).name)
            fsync_directory(target)
            fsync_directory(self._root)
            log.error(
                "%s %d was refused by the server and will not be sent again (kept in %s): %s",
                kind,
                sequence,
                target,
                reason,
            )

    def give_back(self, kind: str, sequence: int, reason: str) -> None:
        """The server refused this entry as it stands (e.g. too stale): hand it back to its writer.

        It moves to returned/, where `returned()` lists it until the writer has
        taken its content back (fedrl.client.federation.weight_sync puts the progress into its
        next update) and calls `forget_returned`.
        """
        with self._lock:
            entry = self._take(kind, sequence)
            target = self._root / RETURNED
            target.mkdir(exist_ok=True)
            os.replace(self._path(entry), target / self._path(entry).name)
            fsync_directory(target)
            fsync_directory(self._root)
            log.warning("%s %d goes back into the next update: %s", kind, sequence, reason)

    def returned(self, kind: str) -> list[Entry]:
        """Entries handed back by give_back and not yet forgotten, oldest first."""
        check_kind(kind)
        with self._lock:
            folder = self._root / RETURNED
            found = []
            for path in sorted(folder.glob(f"{kind}-*")) if folder.is_dir() else []:
                try:
                    found.append(read_entry(path))
                except OutboxError as exc:
                    self._quarantine(path, str(exc))
            return found

    def forget_returned(self, kind: str, sequence: int) -> None:
        """The writer has taken a returned entry back; delete it."""
        check_kind(kind)
        with self._lock:
            folder = self._root / RETURNED
            for path in folder.glob(f"{kind}-{sequence:0{SEQUENCE_DIGITS}d}.*"):
                path.unlink()
            fsync_directory(folder)

    def size(self, kind: str) -> tuple[int, int]:
        """(entries, bytes) held for a kind."""
        with self._lock:
            entries = self._entries[kind]
            return len(entries), sum(e.size for e in entries)

    # Internals.

    def _take(self, kind: str, sequence: int) -> Entry:
        check_kind(kind)
        entries = self._entries[kind]
        for index, entry in enumerate(entries):
            if entry.sequence == sequence:
                return entries.pop(index)
        raise OutboxError(f"no pending {kind} with sequence {sequence}")

    def _enforce_bound(self, kind: str) -> None:
        entries = self._entries[kind]
        limits = self._limits
        while len(entries) > limits.max_entries or sum(e.size for e in entries) > limits.max_bytes:
            merger = self._mergers.get(kind)
            ready = [i for i, e in enumerate(entries) if not e.attempted]
            if merger is None and ready and len(entries) > 1:
                dropped = entries.pop(ready[0])
                self._path(dropped).unlink()
                fsync_directory(self._root)
                log.warning(
                    "outbox over its bound: dropped %s %d (%d bytes); %s has no merge rule",
                    kind,
                    dropped.sequence,
                    dropped.size,
                    kind,
                )
                continue
            # The entry just added is left alone: until the caller has recorded
            # it (fedrl.client.federation.sync_state), it must stay separable.
            newest = len(entries) - 1
            pair = next((i for i in ready if i + 1 in ready and i + 1 < newest), None)
            # No ready pair: a sent head plus one entry, or one update larger
            # than the byte cap. Keeping it over the bound beats losing it.
            if merger is None or pair is None:
                log.warning(
                    "outbox holds %d %s entries (%d bytes), over its bound, with nothing "
                    "left to merge; keeping all of them",
                    len(entries),
                    kind,
                    sum(e.size for e in entries),
                )
                return
            self._merge(kind, pair, merger, why="(outbox over its bound: server unreachable?)")

    def _merge(self, kind: str, index: int, merger: Merger, *, why: str) -> None:
        entries = self._entries[kind]
        earlier, later = entries[index], entries[index + 1]
        messages = tuple(merger(earlier.messages, later.messages))
        merged = self._write(kind, earlier.sequence, messages, merged_through=later.merged_through)
        # The merged file has replaced the earlier one; a crash before the next
        # line leaves `later` inside its merged range, which _recover removes.
        self._path(later).unlink()
        fsync_directory(self._root)
        entries[index : index + 2] = [merged]
        log.warning(
            "merged %s %d..%d into %d %s",
            kind,
            earlier.sequence,
            later.merged_through,
            earlier.sequence,
            why,
        )

    def _write(
        self, kind: str, sequence: int, messages: tuple[bytes, ...], *, merged_through: int
    ) -> Entry:
        data = encode_entry(kind, sequence, messages, merged_through)
        entry = Entry(kind, sequence, messages, False, merged_through, len(data))
        write_atomically(self._path(entry, READY), lambda file: file.write(data))
        return entry

    def _path(self, entry: Entry, state: str | None = None) -> Path:
        if state is None:
            state = SENT if entry.attempted else READY
        return self._root / entry_name(entry.kind, entry.sequence, state)

    def _counter_path(self, kind: str) -> Path:
        return self._root / f"{kind}.sequence"

    def _read_counter(self, kind: str) -> int:
        path = self._counter_path(kind)
        try:
            text = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return 0
        if not text.isdigit():
            # Entries on disk and the server's Join answer still bound it from
            # below, so a restart neither reuses a number nor stops.
            log.error("%s is unreadable (%r); recomputing the %s counter", path, text[:40], kind)
            return 0
        return int(text)

    def _write_counter(self, kind: str, value: int) -> None:
        write_atomically(
            self._counter_path(kind), lambda file: file.write(f"{value}\n".encode("ascii"))
        )
        self._last[kind] = value

    def _recover(self) -> None:
        """Load every entry; delete temp files and merge leftovers; quarantine bad files."""
        for path in sorted(self._root.iterdir()):
            if not path.is_file():
                continue
            if path.name.startswith("."):
                log.info("removing %s, an entry whose write was cut short", path.name)
                path.unlink()
                continue
            if path.suffix not in (READY, SENT):
                continue
            try:
                entry = read_entry(path)
            except OutboxError as exc:
                self._quarantine(path, str(exc))
                continue
            self._entries[entry.kind].append(entry)
        for kind, entries in self._entries.items():
            entries.sort(key=lambda e: e.sequence)
            kept: list[Entry] = []
            for entry in entries:
                if kept and entry.sequence <= kept[-1].merged_through:
                    log.warning(
                        "removing %s %d: already merged into %d before a crash",
                        kind,
                        entry.sequence,
                        kept[-1].sequence,
                    )
                    self._path(entry).unlink()
                    continue
                kept.append(entry)
            self._entries[kind] = kept
            highest = max(
                [e.merged_through for e in kept] + self._numbers_set_aside(kind), default=0
            )
            if highest > self._last[kind]:
                self._write_counter(kind, highest)
        fsync_directory(self._root)

    def _numbers_set_aside(self, kind: str) -> list[int]:
        """Sequences of entries moved out of the queue: they are burnt too."""
        numbers = []
        for folder in (QUARANTINE, REJECTED, RETURNED):
            for path in (self._root / folder).glob(f"{kind}-*"):
                sequence = sequence_from_name(path)
                if sequence is not None:
                    numbers.append(sequence)
        return numbers

    def _quarantine(self, path: Path, reason: str) -> None:
        target = self._root / QUARANTINE
        target.mkdir(exist_ok=True)
        os.replace(path, target / path.name)
        fsync_directory(target)
        fsync_directory(path.parent)
        log.error(
            "outbox entry %s is damaged and will not be sent (moved to %s): %s",
            path.name,
            target,
            reason,
        )
        # Its number may have been acknowledged already; never hand it out again.
        sequence = sequence_from_name(path)
        kind = path.name.split("-", 1)[0]
        if kind in KINDS and sequence is not None and sequence > self._last[kind]:
            self._write_counter(kind, sequence)
