"""Model specs: a canonical form, its hash, and what differs between two specs.

A session is fixed by the hash of its model spec. The hash is taken over a
canonical JSON form defined here, not over protobuf bytes, whose encoding is
not guaranteed to be stable across library versions. Bounds are written with
float.hex so that infinities and every float round-trip exactly.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fedrl.proto.v1 import tensor_pb2 as pb

_SPACE_KINDS = {pb.SPACE_KIND_BOX: "box", pb.SPACE_KIND_DISCRETE: "discrete"}


def _dtype_name(code: int) -> str:
    return (
        pb.DType.Name(code).removeprefix("DTYPE_").lower()
        if code in pb.DType.values()
        else str(code)
    )


def _space(space: pb.SpaceSpec) -> dict[str, Any]:
    return {
        "kind": _SPACE_KINDS.get(space.kind, str(space.kind)),
        "shape": list(space.shape),
        "dtype": _dtype_name(space.dtype),
        "n": space.n,
        "low": [float(v).hex() for v in space.low],
        "high": [float(v).hex() for v in space.high],
    }


def canonical_spec(spec: pb.ModelSpec) -> dict[str, Any]:
    """The spec as plain data, in a fixed order; the input of spec_hash."""
    return {
        "algorithm": spec.algorithm,
        "env_id": spec.env_id,
        "observation_space": _space(spec.observation_space),
        "action_space": _space(spec.action_space),
        "tensors": [
            {"name": t.name, "dtype": _dtype_name(t.dtype), "shape": list(t.shape)}
            for t in spec.tensors
        ],
    }


def spec_hash(spec: pb.ModelSpec) -> str:
    """Hex SHA-256 of the canonical spec."""
    text = json.dumps(canonical_spec(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def spec_difference(expected: pb.ModelSpec, got: pb.ModelSpec) -> str | None:
    """Name the first field where got differs from expected, or None if they agree.

    The text goes into FAILED_PRECONDITION messages, so it says which field,
    what the session has and what the caller sent.
    """
    want, have = canonical_spec(expected), canonical_spec(got)
    for field in ("algorithm", "env_id"):
        if want[field] != have[field]:
            return f"{field}: session has {want[field]!r}, yours is {have[field]!r}" + (
                _family_note(want[field], have[field]) if field == "algorithm" else ""
            )
    for space in ("observation_space", "action_space"):
        for key in ("kind", "shape", "dtype", "n", "low", "high"):
            if want[space][key] != have[space][key]:
                shown = (
                    "differ"
                    if key in ("low", "high")
                    else f"session has {want[space][key]!r}, yours is {have[space][key]!r}"
                )
                return f"{space}.{key}: {shown}"
    if len(want["tensors"]) != len(have["tensors"]):
        return (
            f"tensors: session has {len(want['tensors'])} tensors, yours has {len(have['tensors'])}"
        )
    for index, (a, b) in enumerate(zip(want["tensors"], have["tensors"], strict=True)):
        for key in ("name", "dtype", "shape"):
            if a[key] != b[key]:
                return (
                    f"tensors[{index}].{key} ({a['name']}): session has {a[key]!r}, "
                    f"yours is {b[key]!r}"
                )
    return None


def _family_note(session: str, yours: str) -> str:
    """Names like "dqn/..." and "ppo/...": say so when the learning algorithms themselves differ."""
    want, have = session.partition("/")[0], yours.partition("/")[0]
    if want == have:
        return ""
    return (
        f" (the session learns with {want.upper()}, you with {have.upper()}: a session has one "
        "algorithm; join another session or train with its algorithm)"
    )
