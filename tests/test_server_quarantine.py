"""No record and no participant can stop a server or a session: unappliable updates are set aside.

Quarantined records stay on disk with a note, are counted in Status, and
never come back at the next start; the others' updates still become versions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.storage.record_frames import RecordFrames
from fedrl.server.storage.update_log import UpdateLog
from tests.support.server_harness import (
    InProcessServer,
    join,
    make_spec,
    pull,
    push,
    seed,
    server_config,
    wait_for_version,
)

SPEC = make_spec([(4,)])
ZEROS = [np.zeros(4, np.float32)]
SEGMENT_HEADER = 24
"""Bytes before a segment's first record (server/storage/update_log.py)."""


def session_dir(data_dir: Path) -> Path:
    return data_dir / "sessions" / "default"


def log_update(data_dir: Path, *, sequence: int, episodes: int = 1, value: float = 1.0) -> None:
    """Append a record to the session's update log, as a server older than the range checks did."""
    with UpdateLog(session_dir(data_dir) / "updates") as log:
        log.append(
            session="default",
            participant_id="alice",
            sequence=sequence,
            base_version=0,
            samples=10,
            env_steps=10,
            episodes=episodes,
            weight=10.0,
            staleness=0,
            metrics={},
            tensors=[("t0", np.full(4, value, np.float32))],
        )


def seeded(data_dir: Path, *participants: str) -> None:
    with InProcessServer(server_config(data_dir, buffer_size=1)) as server:
        stub = server.stub()
        for pid in participants:
            join(stub, pid, SPEC)
        seed(stub, participants[0], SPEC, ZEROS)


def quarantined_notes(data_dir: Path) -> list[dict[str, object]]:
    folder = session_dir(data_dir) / "quarantine"
    return [json.loads(p.read_text("utf-8")) for p in sorted(folder.glob("*.json"))]


def test_a_logged_record_that_cannot_be_acknowledged_is_quarantined_and_the_server_starts(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    seeded(data, "alice")
    log_update(data, sequence=1 << 63)
    log_update(data, sequence=1, value=2.0)
    config = server_config(data, buffer_size=1)

    for _ in range(2):  # and again: a quarantined record never comes back
        with InProcessServer(config) as server:
            stub = server.stub()
            header, tensors, _ = pull(stub)
            status = stub.Status(pb.StatusRequest())

    assert header.version == 1
    np.testing.assert_allclose(tensors[0], 2.0)
    assert status.sessions[0].updates_quarantined == 1
    (note,) = quarantined_notes(data)
    assert note["sequence"] == 1 << 63 and "cannot be acknowledged" in str(note["reason"])
    assert (session_dir(data) / "quarantine" / f"{note['lsn']:020d}.rec").stat().st_size > 0


def test_a_record_whose_intact_frame_does_not_decode_is_quarantined(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seeded(data, "alice")
    log_update(data, sequence=1)
    # Bytes after the last tensor, in a frame with a valid CRC: it does not decode.
    segment = next((session_dir(data) / "updates").glob("*.wal"))
    _rewrite_last_record(segment, lambda payload: payload + b"trailing bytes")
    config = server_config(data, buffer_size=1)

    with InProcessServer(config) as server:
        status = server.stub().Status(pb.StatusRequest())

    assert status.sessions[0].updates_quarantined == 1
    (note,) = quarantined_notes(data)
    assert "does not decode" in str(note["reason"])


def test_an_update_that_would_overflow_the_model_is_quarantined_and_the_others_applied(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "data", buffer_size=2, buffer_timeout_s=30.0)
    with InProcessServer(config) as server:
        stub = server.stub()
        for pid in ("alice", "mallory"):
            join(stub, pid, SPEC)
        seed(stub, "alice", SPEC, ZEROS)
        # Finite, but the second half of the sum is beyond float32: the
        # version cannot be made with it. A zero model has no norm reference yet.
        huge = [np.full(4, 3e38, np.float32)]
        push(stub, "mallory", SPEC, huge, sequence=1, base_version=0)
        push(stub, "mallory", SPEC, huge, sequence=2, base_version=0)
        push(stub, "alice", SPEC, [np.ones(4, np.float32)], sequence=1, base_version=0)
        wait_for_version(stub, 1)
        header, tensors, _ = pull(stub)
        status = stub.Status(pb.StatusRequest())

    assert header.version == 1
    assert np.isfinite(tensors[0]).all()
    assert status.sessions[0].updates_quarantined == 1
    (note,) = quarantined_notes(tmp_path / "data")
    assert (note["participant_id"], note["sequence"]) == ("mallory", 2)
    assert "cannot be aggregated" in str(note["reason"])


def test_an_update_far_above_the_recent_norms_is_refused_naming_the_bound(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "data", buffer_size=1)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "alice", SPEC)
        seed(stub, "alice", SPEC, ZEROS)
        for sequence in range(1, 5):
            push(
                stub,
                "alice",
                SPEC,
                [np.full(4, 0.5, np.float32)],
                sequence=sequence,
                base_version=0,
            )
        wait_for_version(stub, 4)
        with pytest.raises(grpc.RpcError) as refused:
            push(stub, "alice", SPEC, [np.full(4, 100.0, np.float32)], sequence=5, base_version=4)
        below_bound = push(
            stub, "alice", SPEC, [np.full(4, 9.9, np.float32)], sequence=6, base_version=4
        )

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds 20 x the median norm 1 of the session's last 4 accepted updates" in (
        refused.value.details()
    )
    assert not below_bound.duplicate


def test_after_near_zero_updates_the_bound_stays_a_share_of_the_model_norm(
    tmp_path: Path,
) -> None:
    # prepare: a model of norm 100, then four updates of almost nothing (an idle learner)
    config = server_config(tmp_path / "data", buffer_size=1)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "alice", SPEC)
        seed(stub, "alice", SPEC, [np.full(4, 50.0, np.float32)])
        for sequence in range(1, 5):
            push(stub, "alice", SPEC, [np.full(4, 1e-8, np.float32)], sequence=sequence,
                 base_version=0)  # fmt: skip
        wait_for_version(stub, 4)

        # act: a new learner's first honest sync (norm 40), then a huge one (norm 200)
        honest = push(stub, "alice", SPEC, [np.full(4, 20.0, np.float32)], sequence=5,
                      base_version=4)  # fmt: skip
        # The bound is read from the newest version: wait for the honest one's
        # (norm 140), or the check races its aggregation.
        wait_for_version(stub, 5)
        with pytest.raises(grpc.RpcError) as refused:
            push(stub, "alice", SPEC, [np.full(4, 100.0, np.float32)], sequence=6, base_version=5)

    # assert: the bound is the model's own norm (20 x 5% of it), not 20 x the median of 2e-8
    assert not honest.duplicate
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds 20 x 0.05 x the norm 140 of global version 5" in refused.value.details()


def test_the_first_updates_are_bounded_by_the_global_model_norm(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data", buffer_size=1)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "alice", SPEC)
        seed(stub, "alice", SPEC, [np.full(4, 0.5, np.float32)])
        with pytest.raises(grpc.RpcError) as refused:
            push(stub, "alice", SPEC, [np.full(4, 1e30, np.float32)], sequence=1, base_version=0)

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the norm 1 of global version 0" in refused.value.details()


def _rewrite_last_record(segment: Path, change: Callable[[bytes], bytes]) -> None:
    """Replace the segment's only record with a changed payload in an intact frame."""
    data = segment.read_bytes()
    head, frame = data[:SEGMENT_HEADER], data[SEGMENT_HEADER:]
    frames = RecordFrames(b"FRec")
    payload = frames.payload(frame, 1)
    assert payload is not None
    segment.write_bytes(head + frames.frame(change(payload), 1))
