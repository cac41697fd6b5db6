"""The durable outbox: crash safety, sequences across restarts, the bound and the merge rule."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from fedrl.client.federation.federation_client import build_update
from fedrl.client.federation.outbox import Outbox, OutboxLimits
from fedrl.client.federation.outbox_file import OutboxError
from fedrl.client.federation.update_entries import update_messages
from fedrl.common.chunking import assemble
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

SHAPES = {"w": (4, 3), "b": (3,)}


def delta_of(value: float) -> list[tuple[str, np.ndarray]]:
    return [(name, np.full(shape, value, dtype=np.float32)) for name, shape in SHAPES.items()]


def update_builder(
    value: float,
    *,
    base_version: int = 0,
    episodes: int = 10,
    mean_return: float = 20.0,
    eval_return: float | None = None,
) -> Callable[[int], Sequence[bytes]]:
    """An outbox builder of one update whose delta is `value` everywhere."""

    def build(sequence: int) -> list[bytes]:
        metrics = pb.UpdateMetrics(mean_return=mean_return)
        if eval_return is not None:
            metrics.eval_return = eval_return
        messages = build_update(
            session="default",
            participant_id="Макар",
            sequence=sequence,
            base_version=base_version,
            env_steps=episodes * 20,
            episodes=episodes,
            samples=episodes * 20,
            metrics=metrics,
            spec_hash="f" * 64,
            delta=delta_of(value),
            dtype=tpb.DTYPE_BFLOAT16,
        )
        return [m.SerializeToString() for m in messages]

    return build


def decoded(messages: Sequence[pb.UpdateChunk]) -> tuple[pb.UpdateHeader, dict[str, np.ndarray]]:
    header = messages[0].header
    tensors = assemble(header.tensors, [m.chunk for m in messages[1:]])
    return header, dict(tensors)


def entry_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_file() and p.suffix in (".ready", ".sent"))


def test_added_update_is_on_disk_with_its_sequence_and_survives_a_restart(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)

    entry = outbox.add("update", update_builder(0.5))
    reopened = Outbox(tmp_path).pending("update")

    assert entry.sequence == 1
    assert entry_files(tmp_path) == ["update-00000000000000000001.ready"]
    assert [(e.sequence, e.messages) for e in reopened] == [(1, entry.messages)]
    header, tensors = decoded(update_messages(reopened[0]))
    assert header.sequence == 1
    np.testing.assert_array_equal(tensors["w"], np.full((4, 3), 0.5))


def test_acknowledged_entry_is_deleted_and_its_sequence_never_reused(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    first = outbox.add("update", update_builder(1.0))
    second = outbox.add("update", update_builder(2.0))

    outbox.acknowledge("update", first.sequence)
    outbox.acknowledge("update", second.sequence)
    after_restart = Outbox(tmp_path).add("update", update_builder(3.0))

    assert entry_files(tmp_path) == ["update-00000000000000000003.ready"]
    assert after_restart.sequence == 3


def test_sequences_of_each_kind_are_separate(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)

    update = outbox.add("update", update_builder(1.0))
    experience = outbox.add("experience", lambda sequence: [b"batch %d" % sequence])

    assert update.sequence == 1
    assert experience.sequence == 1
    assert Outbox(tmp_path).pending("experience")[0].messages == (b"batch 1",)


def test_servers_acknowledged_sequence_lifts_the_counter(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    outbox.add("update", update_builder(1.0))

    outbox.observe_acknowledged("update", 41)
    entry = outbox.add("update", update_builder(2.0))
    outbox.observe_acknowledged("update", 5)

    assert entry.sequence == 42
    assert Outbox(tmp_path).add("update", update_builder(3.0)).sequence == 43


def test_lost_counter_file_resumes_after_the_highest_entry(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    for value in (1.0, 2.0, 3.0):
        outbox.add("update", update_builder(value))
    (tmp_path / "update.sequence").unlink()

    assert Outbox(tmp_path).add("update", update_builder(4.0)).sequence == 4


def test_leftover_temp_file_is_ignored_and_removed(tmp_path: Path) -> None:
    Outbox(tmp_path).add("update", update_builder(1.0))
    leftover = tmp_path / ".update-00000000000000000002.ready.tmp"
    leftover.write_bytes(b"FEDRLOB1 half of an entry")

    pending = Outbox(tmp_path).pending("update")

    assert [e.sequence for e in pending] == [1]
    assert not leftover.exists()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) - 7], id="torn-tail"),
        pytest.param(
            lambda data: data[:-40] + bytes([data[-40] ^ 0x01]) + data[-39:], id="bit-flip"
        ),
        pytest.param(lambda data: b"NOTOURS!" + data[8:], id="bad-magic"),
    ],
)
def test_damaged_entry_is_reported_quarantined_and_not_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[bytes], bytes]
) -> None:
    outbox = Outbox(tmp_path)
    outbox.add("update", update_builder(1.0))
    outbox.add("update", update_builder(2.0))
    path = tmp_path / "update-00000000000000000002.ready"
    path.write_bytes(damage(path.read_bytes()))

    with caplog.at_level(logging.ERROR, logger="fedrl.client.federation.outbox"):
        reopened = Outbox(tmp_path)

    assert [e.sequence for e in reopened.pending("update")] == [1]
    assert (tmp_path / "quarantine" / path.name).exists()
    assert "update-00000000000000000002.ready" in caplog.text
    assert reopened.add("update", update_builder(3.0)).sequence == 3


def test_entry_taken_for_sending_is_marked_attempted_durably(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    outbox.add("update", update_builder(1.0))
    outbox.add("update", update_builder(2.0))

    head = outbox.next_to_send("update", through=1)
    again = outbox.next_to_send("update", through=1)
    reopened = Outbox(tmp_path).pending("update")

    assert head is not None and head.attempted and head.sequence == 1
    assert again == head
    assert [(e.sequence, e.attempted) for e in reopened] == [(1, True), (2, False)]


def test_nothing_is_sent_past_the_released_sequence(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    outbox.add("update", update_builder(1.0))

    assert outbox.next_to_send("update", through=0) is None
    assert not outbox.pending("update")[0].attempted


def test_a_backlog_is_sent_as_one_merged_update(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    for value in (1.0, 2.0, 4.0, 8.0):
        outbox.add("update", update_builder(value, episodes=5))

    head = outbox.next_to_send("update", through=3)

    assert head is not None and (head.sequence, head.merged_through) == (1, 3)
    header, tensors = decoded(update_messages(head))
    assert header.episodes == 15
    np.testing.assert_array_equal(tensors["w"], np.full((4, 3), 7.0))
    assert [e.sequence for e in outbox.pending("update")] == [1, 4]


def test_given_back_entry_waits_in_returned_until_forgotten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path)
    entry = outbox.add("update", update_builder(1.0))

    with caplog.at_level(logging.WARNING, logger="fedrl.client.federation.outbox"):
        outbox.give_back("update", entry.sequence, "update is 18 versions stale")
    reopened = Outbox(tmp_path)
    returned = reopened.returned("update")
    reopened.forget_returned("update", entry.sequence)

    assert outbox.pending("update") == []
    assert [(e.sequence, e.messages) for e in returned] == [(1, entry.messages)]
    assert reopened.returned("update") == []
    assert reopened.add("update", update_builder(2.0)).sequence == 2
    assert "18 versions stale" in caplog.text


def test_over_the_bound_the_oldest_ready_pair_is_merged_by_the_rule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path, limits=OutboxLimits(max_entries=3))
    outbox.add("update", update_builder(1.0, base_version=4, episodes=10, mean_return=10.0))
    outbox.add(
        "update",
        update_builder(2.0, base_version=5, episodes=30, mean_return=30.0, eval_return=99.0),
    )
    outbox.add("update", update_builder(4.0, base_version=6))

    with caplog.at_level(logging.WARNING, logger="fedrl.client.federation.outbox"):
        outbox.add("update", update_builder(8.0, base_version=7))

    pending = outbox.pending("update")
    assert [(e.sequence, e.merged_through) for e in pending] == [(1, 2), (3, 3), (4, 4)]
    header, tensors = decoded(update_messages(pending[0]))
    assert header.sequence == 1
    assert header.base_version == 4
    assert (header.episodes, header.env_steps, header.samples) == (40, 800, 800)
    assert header.metrics.mean_return == pytest.approx(25.0)
    assert header.metrics.eval_return == 99.0
    np.testing.assert_array_equal(tensors["w"], np.full((4, 3), 3.0))
    assert "merged update 1..2 into 1" in caplog.text
    assert entry_files(tmp_path) == [
        "update-00000000000000000001.ready",
        "update-00000000000000000003.ready",
        "update-00000000000000000004.ready",
    ]


def test_an_attempted_entry_is_never_merged(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path, limits=OutboxLimits(max_entries=3))
    outbox.add("update", update_builder(1.0))
    head = outbox.next_to_send("update")
    assert head is not None
    for value in (2.0, 4.0, 8.0):
        outbox.add("update", update_builder(value))

    pending = outbox.pending("update")

    assert pending[0] == head
    assert [(e.sequence, e.merged_through) for e in pending] == [(1, 1), (2, 3), (4, 4)]
    _, tensors = decoded(update_messages(pending[1]))
    np.testing.assert_array_equal(tensors["b"], np.full(3, 6.0))


def test_byte_cap_merges_too(tmp_path: Path) -> None:
    probe = Outbox(tmp_path / "probe").add("update", update_builder(1.0))
    outbox = Outbox(tmp_path / "outbox", limits=OutboxLimits(max_bytes=int(probe.size * 2.5)))

    for value in (1.0, 2.0, 3.0):
        outbox.add("update", update_builder(value))

    count, size = outbox.size("update")
    assert count == 2
    assert size <= probe.size * 2.5


def test_crash_between_merge_and_delete_does_not_send_the_merged_entry_twice(
    tmp_path: Path,
) -> None:
    outbox = Outbox(tmp_path, limits=OutboxLimits(max_entries=3))
    for value in (1.0, 2.0, 4.0):
        outbox.add("update", update_builder(value))
    second = tmp_path / "update-00000000000000000002.ready"
    saved = second.read_bytes()
    outbox.add("update", update_builder(8.0))
    # As if the process died after writing the merged entry 1..2, before deleting 2.
    second.write_bytes(saved)

    pending = Outbox(tmp_path).pending("update")

    assert [(e.sequence, e.merged_through) for e in pending] == [(1, 2), (3, 3), (4, 4)]
    assert not second.exists()


def test_kind_without_merge_rule_drops_its_oldest_ready_entry_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path, limits=OutboxLimits(max_entries=3))

    with caplog.at_level(logging.WARNING, logger="fedrl.client.federation.outbox"):
        for _ in range(4):
            outbox.add("experience", lambda sequence: [b"batch %d" % sequence])

    assert [e.sequence for e in outbox.pending("experience")] == [2, 3, 4]
    assert "dropped experience 1" in caplog.text


def test_rejected_entry_is_kept_aside_with_an_error_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(tmp_path)
    entry = outbox.add("update", update_builder(1.0))

    with caplog.at_level(logging.ERROR, logger="fedrl.client.federation.outbox"):
        outbox.reject("update", entry.sequence, "update is 20 versions stale")

    assert outbox.pending("update") == []
    assert (tmp_path / "rejected" / "update-00000000000000000001.ready").exists()
    assert "20 versions stale" in caplog.text
    assert Outbox(tmp_path).pending("update") == []


def test_unknown_kind_and_unknown_sequence_are_refused(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)

    with pytest.raises(OutboxError, match="unknown outbox kind"):
        outbox.add("gradient", update_builder(1.0))
    with pytest.raises(OutboxError, match="no pending update with sequence 7"):
        outbox.acknowledge("update", 7)


def test_limits_too_small_to_merge_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        OutboxLimits(max_entries=2)


def test_copied_entry_keeps_its_identity(tmp_path: Path) -> None:
    Outbox(tmp_path / "a").add("update", update_builder(1.0))
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "update-00000000000000000001.ready", tmp_path / "b")

    (entry,) = Outbox(tmp_path / "b").pending("update")

    assert entry.sequence == 1
    assert Outbox(tmp_path / "b").add("update", update_builder(2.0)).sequence == 2


def test_sequences_of_set_aside_entries_are_never_reused(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    for value in (1.0, 2.0):
        outbox.add("update", update_builder(value))
    outbox.reject("update", 1, "malformed")
    outbox.give_back("update", 2, "too stale")
    (tmp_path / "update.sequence").unlink()

    assert Outbox(tmp_path).add("update", update_builder(3.0)).sequence == 3
