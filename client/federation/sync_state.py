"""The sync state file: what the next weight delta is measured from, kept across crashes.

`sync/<session>/state.npz` (numpy arrays, read without pickle) holds the
reference (what the server holds of this participant's model: the adopted
global version plus the pushed deltas that version does not include yet),
those in-flight deltas, the local weights and counters when it was written,
the base version and the last update sequence inside the reference. Weight
sync writes it after each outbox entry and each adoption and reads it back
at start; fedrl.client.federation.weight_sync says
how it is reconciled with the outbox and the autosaved model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fedrl.client.federation.errors import SyncError
from fedrl.common.durable_files import write_atomically

NamedArrays = list[tuple[str, npt.NDArray[Any]]]
STATE_FORMAT = 2
STATE_FILE = "state.npz"


@dataclass(frozen=True)
class SyncState:
    """What the next delta is measured from, and the local model it belongs to."""

    base_version: int
    """Global version the reference descends from; -1 before the first adoption."""
    sequence: int
    """Last update sequence whose delta the reference includes (0: none)."""
    pushed_episodes: int
    """The participant's episode counter at the last push."""
    pushed_env_steps: int
    """The participant's env-step counter at the last push."""
    saved_episodes: int
    """The episode counter when this state was written."""
    saved_env_steps: int
    """The env-step counter when this state was written."""
    reference: NamedArrays
    """The adopted global version plus every in-flight delta: what the server will hold of
    this model once it has applied them. The next delta is local − reference."""
    local: NamedArrays
    """Local weights when this state was written."""
    taken_back: tuple[int, ...] = ()
    """Sequences of updates the server refused as too stale whose progress is back in
    local − reference (so a crash before their file is deleted cannot add them twice)."""
    in_flight: tuple[InFlight, ...] = ()
    """Pushed deltas, as the server decodes them, that the adopted version does not include
    yet (oldest first)."""


@dataclass(frozen=True)
class InFlight:
    """A pushed delta exactly as the server decodes it (wire precision), by its sequence."""

    sequence: int
    delta: NamedArrays


def save_sync_state(path: Path, state: SyncState) -> None:
    """Write atomically (temp file, fsync, rename, directory fsync)."""
    meta = {
        "format": STATE_FORMAT,
        "base_version": state.base_version,
        "sequence": state.sequence,
        "pushed_episodes": state.pushed_episodes,
        "pushed_env_steps": state.pushed_env_steps,
        "saved_episodes": state.saved_episodes,
        "saved_env_steps": state.saved_env_steps,
        "taken_back": list(state.taken_back),
        "in_flight": [pushed.sequence for pushed in state.in_flight],
        "names": [name for name, _ in state.reference],
    }
    arrays: dict[str, Any] = {
        "meta": np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    }
    for index, ((_, reference), (_, local)) in enumerate(
        zip(state.reference, state.local, strict=True)
    ):
        arrays[f"reference_{index}"] = np.asarray(reference, dtype=np.float32)
        arrays[f"local_{index}"] = np.asarray(local, dtype=np.float32)
    for slot, pushed in enumerate(state.in_flight):
        for index, (_, delta) in enumerate(pushed.delta):
            arrays[f"in_flight_{slot}_{index}"] = np.asarray(delta, dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda file: np.savez(file, **arrays))


def load_sync_state(path: Path) -> SyncState | None:
    """The saved state, or None if there is none; SyncError if it cannot be trusted."""
    if not path.exists():
        return None
    try:
        # allow_pickle=False: a state dir copied from elsewhere must not run code.
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode("utf-8"))
            # Format 1 had no in-flight deltas: its reference was the model at the last push.
            if meta.get("format") not in (1, STATE_FORMAT):
                raise SyncError(f"{path} has format {meta.get('format')}, expected {STATE_FORMAT}")
            names = [str(n) for n in meta["names"]]
            reference = [(n, np.array(data[f"reference_{i}"])) for i, n in enumerate(names)]
            local = [(n, np.array(data[f"local_{i}"])) for i, n in enumerate(names)]
            in_flight = tuple(
                InFlight(
                    int(sequence),
                    [(n, np.array(data[f"in_flight_{slot}_{i}"])) for i, n in enumerate(names)],
                )
                for slot, sequence in enumerate(meta.get("in_flight", []))
            )
            return SyncState(
                base_version=int(meta["base_version"]),
                sequence=int(meta["sequence"]),
                pushed_episodes=int(meta["pushed_episodes"]),
                pushed_env_steps=int(meta["pushed_env_steps"]),
                saved_episodes=int(meta["saved_episodes"]),
                saved_env_steps=int(meta["saved_env_steps"]),
                reference=reference,
                local=local,
                taken_back=tuple(int(s) for s in meta["taken_back"]),
                in_flight=in_flight,
            )
    except SyncError:
        raise
    except Exception as exc:
        raise SyncError(
            f"{path} cannot be read ({exc}); move it away to resynchronise from the server"
        ) from exc
