"""What a session accepts: a spec that fixes it, and tensors that fit it.

A spec is refused at Join when no update could ever match it (no tensors,
duplicate names, a dtype that is not a float, too many dimensions, bounds that
do not fit the observation shape, a model above --max-model-bytes). Tensors
are refused when their count, names, shapes or dtypes differ from the
session's spec or when they hold NaN or infinity; what passes is float32 in
the spec's order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedrl.common.serde import addressable
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.federation.aggregator import NamedTensors
from fedrl.server.refusals import InvalidRequestError, LimitExceededError

ACCEPTED_DELTA_DTYPES = (tpb.DTYPE_FLOAT32, tpb.DTYPE_FLOAT16, tpb.DTYPE_BFLOAT16)
MAX_DIMS = 32
"""Dimensions a spec's tensor or observation space may have: more than any network uses, and
few enough that sizes and messages stay small (a Join naming 5,000 dimensions of 2^62 each
made the size's decimal form too long for Python to print, answering UNKNOWN)."""


def check_spec(spec: tpb.ModelSpec, *, max_model_bytes: int) -> None:
    """Refuse a spec no update could ever match, before it fixes a session."""
    if not spec.tensors:
        raise InvalidRequestError("the model spec lists no tensors")
    names = [t.name for t in spec.tensors]
    if len(set(names)) != len(names) or not all(names):
        raise InvalidRequestError("model spec tensor names must be non-empty and unique")
    _check_bounds(spec.observation_space, "observation_space")
    total = 0
    for tensor in spec.tensors:
        if tensor.dtype not in ACCEPTED_DELTA_DTYPES:
            raise InvalidRequestError(
                f"model spec tensor {tensor.name!r} has dtype {tensor.dtype}; "
                "trainable tensors are float32, float16 or bfloat16"
            )
        _check_dims(tensor.shape, f"model spec tensor {tensor.name!r}")
        total += math.prod(tensor.shape) * 4
    if total > max_model_bytes:
        raise LimitExceededError(
            f"the model is {total} bytes as float32, above this server's limit of "
            f"{max_model_bytes} (--max-model-bytes)"
        )


def _check_bounds(space: tpb.SpaceSpec, what: str) -> None:
    """Box bounds the experience validation can hold observations to: none, or one per element."""
    _check_dims(space.shape, f"{what}.shape")
    if not space.low and not space.high:
        return
    size = math.prod(space.shape)
    if len(space.low) != size or len(space.high) != size:
        raise InvalidRequestError(
            f"{what} has {len(space.low)} low and {len(space.high)} high bounds; "
            f"its shape {_shape_text(space.shape)} needs {size} of each (or none)"
        )
    for index, (low, high) in enumerate(zip(space.low, space.high, strict=True)):
        if not low <= high:
            raise InvalidRequestError(
                f"{what} bound {index} is low {low}, high {high}; bounds need low <= high"
            )


def _check_dims(shape: Sequence[int], what: str) -> None:
    if len(shape) > MAX_DIMS:
        raise InvalidRequestError(
            f"{what} has {len(shape)} dimensions {_shape_text(shape)}; at most {MAX_DIMS}"
        )
    if any(dim < 0 for dim in shape):
        raise InvalidRequestError(f"{what} has a negative dimension {_shape_text(shape)}")
    if not addressable(shape, 8):
        raise InvalidRequestError(
            f"{what} has shape {_shape_text(shape)}, too large for any array, even an empty one"
        )


def _shape_text(shape: Sequence[int]) -> str:
    """A shape for a message: whole when short, its first dimensions and a count when long."""
    dims = list(shape)
    if len(dims) <= 8:
        return str(dims)
    return f"[{', '.join(map(str, dims[:8]))}, ... ({len(dims)} dimensions)]"


def check_tensors(spec: tpb.ModelSpec, tensors: NamedTensors, *, what: str) -> NamedTensors:
    """Tensors in the spec's order, names and shapes, as float32; InvalidRequestError if not."""
    if len(tensors) != len(spec.tensors):
        raise InvalidRequestError(
            f"{what} has {len(tensors)} tensors, the session's model has {len(spec.tensors)}"
        )
    checked: NamedTensors = []
    for index, ((name, array), expected) in enumerate(zip(tensors, spec.tensors, strict=True)):
        if name != expected.name:
            raise InvalidRequestError(
                f"{what} tensor {index} is {name!r}, the session's model has {expected.name!r}"
            )
        if tuple(array.shape) != tuple(expected.shape):
            raise InvalidRequestError(
                f"{what} tensor {name!r} has shape {list(array.shape)}, "
                f"the session's model has {list(expected.shape)}"
            )
        if array.dtype.kind != "f":
            raise InvalidRequestError(f"{what} tensor {name!r} is {array.dtype}, not floating")
        values = np.asarray(array, dtype=np.float32)
        # The decoders check this too; the domain does not rely on every caller being one.
        if not np.isfinite(values).all():
            raise InvalidRequestError(f"{what} tensor {name!r} contains NaN or infinite values")
        checked.append((name, values))
    return checked
