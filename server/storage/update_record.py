"""One update log record's payload: what an acknowledged update is on disk, and back.

The update log (storage/update_log.py) frames and numbers the records; this
module turns an update into the bytes of one payload and back. All integers
little-endian::

      base_version i64, sequence u64, samples u64, env_steps u64, episodes u64,
      weight f64, staleness u32, received_unix_ms i64,
      session, participant_id, metrics: each u32 byte count + UTF-8
        (metrics is a JSON object of name -> number),
      tensor count u32, then per tensor:
        name (u32 byte count + UTF-8), encoding u8, ndim u8, shape u64 x ndim,
        data byte count u64, data.

Tensors are float32 deltas. Each is stored in the smallest form that gives
back exactly the same float32 values: encoding 1 stores the upper 16 bits of
each value (a delta that arrived as bfloat16 is exactly that: half the
bytes), 2 stores float16 (a delta that arrived as float16), 0 stores float32.
Nothing is pickled; LoggedUpdate.tensors always holds float32 arrays.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_FIXED = struct.Struct("<qQQQQdIq")
_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MAX_NDIM = 64

# Tensor encodings; see the module docstring.
_FLOAT32, _BFLOAT16_BITS, _FLOAT16 = 0, 1, 2
_ITEMSIZE = {_FLOAT32: 4, _BFLOAT16_BITS: 2, _FLOAT16: 2}
# Values tried before a full pass: one that fails rules an encoding out cheaply.
_PROBE = 64


class RecordDecodeError(ValueError):
    """A payload that is not an update record; the message says where it stops making sense."""


@dataclass(frozen=True, eq=False)
class LoggedUpdate:
    """One acknowledged update as the log holds it (eq=False: arrays have no truth value)."""

    lsn: int
    """Log sequence number: assigned by the log, strictly increasing, kept across restarts."""
    session: str
    participant_id: str
    sequence: int
    """The participant's exactly-once key for this push."""
    base_version: int
    samples: int
    env_steps: int
    episodes: int
    weight: float
    """Weight given at acknowledgement (samples cap x staleness discount)."""
    staleness: int
    """Versions between base_version and the newest global when acknowledged."""
    metrics: dict[str, float]
    tensors: list[tuple[str, np.ndarray]]
    """The decoded delta, float32, in model order."""
    received_unix_ms: int

    @property
    def acked_version(self) -> int:
        """The newest global version when the push was acknowledged (PushReply.current_version)."""
        return self.base_version + self.staleness


@dataclass(frozen=True)
class UnreadableRecord:
    """A record whose frame is intact (CRC) but whose payload does not decode."""

    lsn: int
    payload: bytes
    reason: str


def record_payload(update: LoggedUpdate) -> bytes:
    """The payload the log stores for `update` (the module docstring's layout)."""
    return _encode_payload(
        session=update.session.encode("utf-8", "surrogatepass"),
        participant_id=update.participant_id.encode("utf-8", "surrogatepass"),
        fixed=_FIXED.pack(
            update.base_version,
            update.sequence,
            update.samples,
            update.env_steps,
            update.episodes,
            update.weight,
            update.staleness,
            update.received_unix_ms,
        ),
        metrics=update.metrics,
        tensors=update.tensors,
    )


def encode_update(
    *,
    session: str,
    participant_id: str,
    sequence: int,
    base_version: int,
    samples: int,
    env_steps: int,
    episodes: int,
    weight: float,
    staleness: int,
    metrics: Mapping[str, float],
    tensors: Sequence[tuple[str, np.ndarray]],
    received_unix_ms: int,
) -> tuple[bytes, LoggedUpdate]:
    """The payload of an update, and the update as the log gives it back (LSN still 0).

    Refuses values the payload cannot hold (TypeError or ValueError naming
    the field). The update shares the given float32 arrays.
    """
    clean_metrics = _checked_metrics(metrics)
    clean_tensors = _checked_tensors(tensors)
    payload = _encode_payload(
        session=_checked_text(session, "session"),
        participant_id=_checked_text(participant_id, "participant_id"),
        fixed=_fixed_fields(
            base_version=base_version,
            sequence=sequence,
            samples=samples,
            env_steps=env_steps,
            episodes=episodes,
            weight=weight,
            staleness=staleness,
            received_unix_ms=received_unix_ms,
        ),
        metrics=clean_metrics,
        tensors=clean_tensors,
    )
    update = LoggedUpdate(
        lsn=0,
        session=session,
        participant_id=participant_id,
        sequence=int(sequence),
        base_version=int(base_version),
        samples=int(samples),
        env_steps=int(env_steps),
        episodes=int(episodes),
        weight=float(weight),
        staleness=int(staleness),
        metrics=clean_metrics,
        tensors=[(name, np.asarray(array, dtype=np.float32)) for name, array in clean_tensors],
        received_unix_ms=int(received_unix_ms),
    )
    return payload, update


def _fixed_fields(
    *,
    base_version: int,
    sequence: int,
    samples: int,
    env_steps: int,
    episodes: int,
    weight: float,
    staleness: int,
    received_unix_ms: int,
) -> bytes:
    """The fixed-size part of a payload, refusing values its fields cannot hold."""
    i64, u64, u32 = (-(1 << 63), (1 << 63) - 1), (0, (1 << 64) - 1), (0, (1 << 32) - 1)
    checked = {
        "base_version": (base_version, i64),
        "sequence": (sequence, u64),
        "samples": (samples, u64),
        "env_steps": (env_steps, u64),
        "episodes": (episodes, u64),
        "staleness": (staleness, u32),
        "received_unix_ms": (received_unix_ms, i64),
    }
    for name, (value, (low, high)) in checked.items():
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    if not math.isfinite(weight):
        raise ValueError(f"weight must be finite, got {weight}")
    return _FIXED.pack(
        base_version,
        sequence,
        samples,
        env_steps,
        episodes,
        float(weight),
        staleness,
        received_unix_ms,
    )


def _encode_payload(
    *,
    session: bytes,
    participant_id: bytes,
    fixed: bytes,
    metrics: dict[str, float],
    tensors: list[tuple[str, np.ndarray]],
) -> bytes:
    metrics_json = json.dumps(metrics, separators=(",", ":")).encode("utf-8")
    parts: list[bytes | memoryview] = [fixed]
    for text in (session, participant_id, metrics_json):
        parts += [_U32.pack(len(text)), text]
    parts.append(_U32.pack(len(tensors)))
    for name, array in tensors:
        encoding, data = _compact(array)
        name_bytes = name.encode("utf-8")
        parts += [
            _U32.pack(len(name_bytes)),
            name_bytes,
            _U8.pack(encoding),
            _U8.pack(array.ndim),
            struct.pack(f"<{array.ndim}Q", *array.shape),
            _U64.pack(data.nbytes),
            data.data,
        ]
    # join takes the arrays' buffers directly: the only copy of the data.
    return b"".join(parts)


def _compact(array: np.ndarray) -> tuple[int, np.ndarray]:
    """The smallest encoding that gives back exactly these float32 values, as a flat array."""
    values = np.ascontiguousarray(array, dtype="<f4").reshape(-1)
    # Little-endian float32 as 16-bit words: [low half, high half] per value.
    halves = values.view("<u2")
    low, high = halves[0::2], halves[1::2]
    if not low[:_PROBE].any() and not low.any():
        return _BFLOAT16_BITS, np.ascontiguousarray(high)
    if _float16_exact(values[:_PROBE]) and _float16_exact(values):
        return _FLOAT16, values.astype("<f2")
    return _FLOAT32, values


def _float16_exact(values: np.ndarray) -> bool:
    with np.errstate(over="ignore"):
        back = values.astype("<f2").astype("<f4")
    return bool(np.array_equal(back.view("<u4"), values.view("<u4")))


def decode_update(payload: bytes, lsn: int) -> LoggedUpdate:
    """Rebuild record `lsn`; any inconsistency is RecordDecodeError, never a partial record."""
    reader = _Reader(payload)
    try:
        fixed = reader.take_struct(_FIXED)
        session = reader.take_text()
        participant_id = reader.take_text()
        metrics = _parse_metrics(reader.take_text())
        tensors = [_decode_tensor(reader) for _ in range(reader.take_struct(_U32)[0])]
        if reader.remaining:
            raise ValueError(f"{reader.remaining} bytes left over after the last tensor")
    except (ValueError, struct.error, OverflowError, RecursionError) as error:
        raise RecordDecodeError(str(error)) from error
    base_version, sequence, samples, env_steps, episodes, weight, staleness, received = fixed
    return LoggedUpdate(
        lsn=lsn,
        session=session,
        participant_id=participant_id,
        sequence=sequence,
        base_version=base_version,
        samples=samples,
        env_steps=env_steps,
        episodes=episodes,
        weight=weight,
        staleness=staleness,
        metrics=metrics,
        tensors=tensors,
        received_unix_ms=received,
    )


def _decode_tensor(reader: _Reader) -> tuple[str, np.ndarray]:
    name = reader.take_text()
    encoding, ndim = reader.take_struct(_U8)[0], reader.take_struct(_U8)[0]
    if encoding not in _ITEMSIZE:
        raise ValueError(f"tensor {name!r}: unknown encoding {encoding}")
    if ndim > _MAX_NDIM:
        raise ValueError(f"tensor {name!r}: {ndim} dimensions")
    shape = struct.unpack(f"<{ndim}Q", reader.take(8 * ndim))
    size = math.prod(shape)
    (length,) = reader.take_struct(_U64)
    if length != size * _ITEMSIZE[encoding]:
        raise ValueError(f"tensor {name!r}: {length} data bytes for shape {shape}")
    data = reader.take(length)
    if encoding == _BFLOAT16_BITS:
        values = (np.frombuffer(data, dtype="<u2").astype("<u4") << 16).view("<f4")
    elif encoding == _FLOAT16:
        values = np.frombuffer(data, dtype="<f2").astype("<f4")
    else:
        values = np.frombuffer(data, dtype="<f4").copy()
    return name, values.astype(np.float32, copy=False).reshape(shape)


def _parse_metrics(text: str) -> dict[str, float]:
    metrics = json.loads(text)
    if not isinstance(metrics, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values()
    ):
        raise ValueError("metrics are not an object of numbers")
    return {str(k): float(v) for k, v in metrics.items()}


class _Reader:
    """Bounds-checked cursor over a payload; slices are views, not copies."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._position = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self._position

    def take(self, count: int) -> memoryview:
        if count > self.remaining:
            raise ValueError(f"needs {count} bytes, {self.remaining} left")
        start = self._position
        self._position += count
        return self._data[start : self._position]

    def take_struct(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack(self.take(layout.size))

    def take_text(self) -> str:
        (length,) = self.take_struct(_U32)
        return str(self.take(int(length)), "utf-8")


def _checked_text(value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value)}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {value!r} is not valid Unicode") from None


def _checked_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    result = {}
    for key, value in metrics.items():
        _checked_text(key, "metric name")
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
            raise TypeError(f"metric {key!r} must be a number, got {value!r}")
        result[key] = float(value)
    return result


def _checked_tensors(tensors: Sequence[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
    result = list(tensors)
    for index, (name, array) in enumerate(result):
        _checked_text(name, f"tensor {index} name")
        # Any byte order: _compact stores little-endian either way.
        if not isinstance(array, np.ndarray) or array.dtype.newbyteorder("=") != np.float32:
            kind = array.dtype if isinstance(array, np.ndarray) else type(array)
            raise ValueError(f"tensor {name!r}: the log holds float32 deltas, got {kind}")
        if array.ndim > _MAX_NDIM:
            raise ValueError(f"tensor {name!r}: {array.ndim} dimensions, at most {_MAX_NDIM}")
    return result
