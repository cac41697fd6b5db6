"""The outbox's weight-update entries: their messages, their decoded delta, and merging two.

The sync loop pushes INCREMENTAL deltas: each delta is local − reference,
where the reference is the weights at the last push or adoption of a global
model. Two consecutive updates therefore describe disjoint stretches of
training, and their sum is exactly the update that one push covering both
stretches would have carried. A merge sums the deltas and the counts (env
steps, episodes, samples), keeps the earlier sequence number and the earlier
base version (the conservative staleness), the episode-weighted mean of the
training returns, and the later entry's other metrics (the latest
evaluation). Summing bfloat16-rounded deltas rounds once more, a relative
error of about 2^-8 per merge on the merged values, which an outage of many
syncs costs anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedrl.client.federation.federation_client import build_update
from fedrl.client.federation.outbox_file import Entry, OutboxError
from fedrl.common.chunking import DEFAULT_CHUNK_BYTES, DecodeLimits, assemble
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

UPDATE = "update"
"""The outbox kind of weight updates."""


def merge_updates(
    earlier: Sequence[bytes], later: Sequence[bytes], *, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> list[bytes]:
    """Two consecutive incremental updates as one (the rule in the module docstring); the
    outbox's merger for UPDATE entries.

    chunk_bytes must not exceed the server's (the sync loop passes the session's).
    """
    first, first_delta, wire_dtype = _decode_update(earlier)
    second, second_delta, _ = _decode_update(later)
    if [n for n, _ in first_delta] != [n for n, _ in second_delta]:
        raise OutboxError(
            f"updates {first.sequence} and {second.sequence} hold different tensors; cannot merge"
        )
    metrics = pb.UpdateMetrics()
    metrics.CopyFrom(second.metrics)
    episodes = first.episodes + second.episodes
    if first.metrics.HasField("mean_return") and second.metrics.HasField("mean_return"):
        metrics.mean_return = (
            (
                first.metrics.mean_return * first.episodes
                + second.metrics.mean_return * second.episodes
            )
            / episodes
            if episodes
            else second.metrics.mean_return
        )
    elif first.metrics.HasField("mean_return"):
        metrics.mean_return = first.metrics.mean_return
    delta = [
        (name, (a + b).astype(np.float32))
        for (name, a), (_, b) in zip(first_delta, second_delta, strict=True)
    ]
    messages = build_update(
        session=first.session,
        participant_id=first.participant_id,
        sequence=first.sequence,
        base_version=first.base_version,
        env_steps=first.env_steps + second.env_steps,
        episodes=episodes,
        samples=first.samples + second.samples,
        metrics=metrics,
        spec_hash=first.spec_hash,
        delta=delta,
        dtype=wire_dtype,
        chunk_bytes=chunk_bytes,
    )
    return [m.SerializeToString() for m in messages]


def update_messages(entry: Entry) -> list[pb.UpdateChunk]:
    """An update entry's messages, parsed for sending."""
    return [pb.UpdateChunk.FromString(m) for m in entry.messages]


def decode_update(entry: Entry) -> tuple[pb.UpdateHeader, list[tuple[str, np.ndarray]]]:
    """An update entry's header and its delta, decoded to float32."""
    header, delta, _ = _decode_update(entry.messages)
    return header, delta


def _decode_update(
    messages: Sequence[bytes],
) -> tuple[pb.UpdateHeader, list[tuple[str, np.ndarray]], int]:
    parsed = [pb.UpdateChunk.FromString(m) for m in messages]
    if not parsed or not parsed[0].HasField("header"):
        raise OutboxError("an update entry must start with its UpdateHeader")
    header = parsed[0].header
    chunks = [m.chunk for m in parsed[1:]]
    # Our own bytes, CRC-checked: only the sizes need room, not distrust.
    delta = assemble(header.tensors, chunks, DecodeLimits(max_total_raw_bytes=1 << 40))
    wire_dtype = chunks[0].header.dtype if chunks else tpb.DTYPE_BFLOAT16
    return header, delta, int(wire_dtype)
