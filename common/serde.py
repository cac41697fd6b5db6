"""numpy arrays <-> tensor messages of protocol v1.

Arrays cross the wire as dtype + shape + codec + little-endian bytes, never
pickled: unpickling runs code chosen by whoever wrote the bytes.

Decoding checks, in this order and before allocating anything: the dtype is on
the allow-list, the shape is sane, shape x itemsize equals the declared raw
size, that size is within the caller's bound, the payload has its declared
length, and it expands to exactly the raw size. Floating values must be finite
unless the caller says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from fedrl.common.bfloat16 import bfloat16_bits_to_float32, float32_to_bfloat16_bits
from fedrl.common.codecs import CODECS, decode_bytes, encode_bytes
from fedrl.common.errors import DecodeError
from fedrl.proto.v1 import tensor_pb2 as pb

__all__ = [
    "DTYPE_NAMES",
    "DecodeError",
    "decode_tensor",
    "encode_tensor",
    "header_raw_size",
    "wire_dtype",
]


@dataclass(frozen=True)
class _WireType:
    name: str
    # How the bytes are laid out on the wire (little-endian).
    storage: np.dtype[np.generic]
    # What a decoder hands back: half precision widens to float32 because
    # numpy has no bfloat16 and float16 arithmetic is slow and lossy.
    decoded: np.dtype[np.generic]


_WIRE: dict[int, _WireType] = {
    pb.DTYPE_FLOAT32: _WireType("float32", np.dtype("<f4"), np.dtype(np.float32)),
    pb.DTYPE_FLOAT16: _WireType("float16", np.dtype("<f2"), np.dtype(np.float32)),
    pb.DTYPE_BFLOAT16: _WireType("bfloat16", np.dtype("<u2"), np.dtype(np.float32)),
    pb.DTYPE_INT64: _WireType("int64", np.dtype("<i8"), np.dtype(np.int64)),
    pb.DTYPE_INT32: _WireType("int32", np.dtype("<i4"), np.dtype(np.int32)),
    pb.DTYPE_UINT8: _WireType("uint8", np.dtype("u1"), np.dtype(np.uint8)),
    pb.DTYPE_BOOL: _WireType("bool", np.dtype("?"), np.dtype(np.bool_)),
}

DTYPE_NAMES: dict[int, str] = {code: wire.name for code, wire in _WIRE.items()}
_BY_NAME: dict[str, int] = {name: code for code, name in DTYPE_NAMES.items()}
_NATIVE: dict[np.dtype[np.generic], int] = {
    np.dtype(np.float32): pb.DTYPE_FLOAT32,
    np.dtype(np.float16): pb.DTYPE_FLOAT16,
    np.dtype(np.int64): pb.DTYPE_INT64,
    np.dtype(np.int32): pb.DTYPE_INT32,
    np.dtype(np.uint8): pb.DTYPE_UINT8,
    np.dtype(np.bool_): pb.DTYPE_BOOL,
}
_FLOATING = {pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16}

# A tensor of more dimensions than this is not a model or a transition column.
MAX_DIMS = 8
MAX_NAME_CHARS = 256


ADDRESSABLE_BYTES = 2**62
"""A bound below what numpy can index (2^63 bytes)."""


def addressable(shape: Sequence[int], itemsize: int) -> bool:
    """Whether numpy can lay `shape` out at all.

    numpy sizes even an empty array by the product of its other dimensions
    and refuses one where that overflows, so a zero among huge dimensions
    must be refused by a decoder as clearly as a huge tensor is.
    """
    return math.prod(dim for dim in shape if dim) * itemsize <= ADDRESSABLE_BYTES


def wire_dtype(name_or_code: str | int) -> int:
    """The DType code for 'float32', 'bfloat16', ... (or a code, checked)."""
    if isinstance(name_or_code, int):
        if name_or_code not in _WIRE:
            raise ValueError(f"unknown dtype code {name_or_code}")
        return name_or_code
    try:
        return _BY_NAME[name_or_code]
    except KeyError:
        raise ValueError(
            f"unknown dtype {name_or_code!r}; choose one of {sorted(_BY_NAME)}"
        ) from None


def encode_tensor(
    name: str,
    array: npt.ArrayLike,
    *,
    dtype: int | None = None,
    codec: int = pb.CODEC_ZSTD,
) -> tuple[pb.TensorHeader, bytes]:
    """Encode one array; dtype converts floating arrays (e.g. to bfloat16) on the way."""
    values = np.asarray(array)
    native = _NATIVE.get(values.dtype)
    if native is None:
        raise ValueError(
            f"tensor {name!r}: dtype {values.dtype} cannot travel; cast to one of "
            f"{sorted(DTYPE_NAMES.values())}"
        )
    target = native if dtype is None else wire_dtype(dtype)
    if target != native and not (native in _FLOATING and target in _FLOATING):
        raise ValueError(f"tensor {name!r}: cannot send {values.dtype} as {DTYPE_NAMES[target]}")
    if codec not in CODECS:
        raise ValueError(f"tensor {name!r}: unknown codec {codec}")
    if target == pb.DTYPE_BFLOAT16:
        stored: np.ndarray = float32_to_bfloat16_bits(values.astype(np.float32, copy=False))
    else:
        stored = values.astype(_WIRE[target].storage, copy=False)
    raw = stored.tobytes()
    data = encode_bytes(codec, raw)
    header = pb.TensorHeader(
        name=name,
        # The generated stubs type enum fields as their wrapper class; the
        # values are the same ints.
        dtype=cast(pb.DType, target),
        shape=list(values.shape),
        codec=cast(pb.Codec, codec),
        raw_size=len(raw),
        encoded_size=len(data),
    )
    return header, data


def header_raw_size(header: pb.TensorHeader, *, max_raw_bytes: int) -> int:
    """Check a header on its own and return its raw size; DecodeError if it is not sane."""
    if not header.name or len(header.name) > MAX_NAME_CHARS:
        raise DecodeError(f"tensor name must be 1..{MAX_NAME_CHARS} characters")
    label = f"tensor {header.name!r}"
    wire = _WIRE.get(header.dtype)
    if wire is None:
        raise DecodeError(f"{label}: dtype {header.dtype} is not allowed")
    if header.codec not in CODECS:
        raise DecodeError(f"{label}: codec {header.codec} is not allowed")
    if len(header.shape) > MAX_DIMS:
        raise DecodeError(f"{label}: {len(header.shape)} dimensions, at most {MAX_DIMS}")
    if any(dim < 0 for dim in header.shape):
        raise DecodeError(f"{label}: negative dimension in shape {list(header.shape)}")
    expected = math.prod(header.shape) * wire.storage.itemsize
    if expected != header.raw_size:
        raise DecodeError(
            f"{label}: shape {list(header.shape)} of {wire.name} is {expected} bytes, "
            f"header says {header.raw_size}"
        )
    if expected > max_raw_bytes:
        raise DecodeError(f"{label}: {expected} bytes exceeds the limit of {max_raw_bytes}")
    if not addressable(header.shape, wire.storage.itemsize):
        raise DecodeError(
            f"{label}: shape {list(header.shape)} of {wire.name} is too large for any array, "
            "even an empty one"
        )
    return expected


def decode_tensor(
    header: pb.TensorHeader,
    data: bytes | bytearray | memoryview,
    *,
    max_raw_bytes: int,
    require_finite: bool = True,
) -> np.ndarray:
    """Decode one tensor's payload after checking it against its header and the bound."""
    raw_size = header_raw_size(header, max_raw_bytes=max_raw_bytes)
    label = f"tensor {header.name!r}"
    if len(data) != header.encoded_size:
        raise DecodeError(
            f"{label}: payload has {len(data)} bytes, header says {header.encoded_size}"
        )
    try:
        raw = decode_bytes(header.codec, data, raw_size)
    except DecodeError as exc:
        raise DecodeError(f"{label}: {exc}") from None
    wire = _WIRE[header.dtype]
    stored = np.frombuffer(raw, dtype=wire.storage).reshape(tuple(header.shape))
    if header.dtype == pb.DTYPE_BFLOAT16:
        values: np.ndarray = bfloat16_bits_to_float32(stored)
    elif header.dtype == pb.DTYPE_BOOL:
        # Any byte other than 0/1 is not a bool numpy would have written.
        if stored.size and np.frombuffer(raw, dtype=np.uint8).max() > 1:
            raise DecodeError(f"{label}: bool bytes must be 0 or 1")
        values = stored.astype(wire.decoded)
    else:
        values = stored.astype(wire.decoded)
    if require_finite and header.dtype in _FLOATING and not np.isfinite(values).all():
        raise DecodeError(f"{label}: contains NaN or infinite values")
    return values
