"""The shared-memory ring and weights board: round trips, versions, and nothing left in /dev/shm."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedrl.client.training.shm import (
    SEGMENT_PREFIX,
    BoardLayout,
    RingLayout,
    SlotFill,
    SlotRing,
    WeightsBoard,
)
from fedrl.client.training.transitions import LearnerTransitions

SHM = Path("/dev/shm")


def batch(rows: int, seed: int = 0) -> LearnerTransitions:
    rng = np.random.default_rng(seed)
    return LearnerTransitions(
        obs=rng.standard_normal((rows, 3)).astype(np.float32),
        action=rng.integers(0, 4, rows).astype(np.int64),
        reward=rng.standard_normal(rows).astype(np.float32),
        next_obs=rng.standard_normal((rows, 3)).astype(np.float32),
        discount=rng.uniform(0, 1, rows).astype(np.float32),
    )


def weights(value: float) -> list[tuple[str, np.ndarray]]:
    return [
        ("w", np.full((3, 2), value, dtype=np.float32)),
        ("b", np.full((2,), value, dtype=np.float32)),
    ]


def test_a_slot_written_through_one_attachment_reads_back_through_another() -> None:
    # prepare
    layout = RingLayout(num_slots=2, rows_per_slot=10, episodes_per_slot=4, obs_shape=(3,))
    owner = SlotRing(layout)
    attached = SlotRing(layout, name=owner.name)
    sent = batch(7)

    # act
    attached.slots[1].write(sent, np.array([1.5, 2.5]), np.array([3, 4]))
    got, returns, lengths = owner.slots[1].read(SlotFill(slot=1, rows=7, episodes=2, env_steps=9))

    # assert
    for name in ("obs", "action", "reward", "next_obs", "discount"):
        np.testing.assert_array_equal(getattr(got, name), getattr(sent, name))
    assert returns.tolist() == [1.5, 2.5] and lengths.tolist() == [3, 4]
    attached.close()
    owner.close()


def test_an_overfull_slot_is_refused() -> None:
    ring = SlotRing(RingLayout(num_slots=1, rows_per_slot=4, episodes_per_slot=1, obs_shape=(3,)))
    with pytest.raises(ValueError, match="slot holds 4 rows"):
        ring.slots[0].write(batch(5), np.zeros(0), np.zeros(0, dtype=np.int64))
    ring.close()


def test_the_board_versions_every_publish_and_readers_get_the_newest() -> None:
    # prepare
    board = WeightsBoard(BoardLayout.of(weights(0.0)))
    reader = WeightsBoard(board.layout, name=board.name)

    # act
    board.publish(weights(1.0))
    version = board.publish(weights(2.0))
    read_version, arrays = reader.read()

    # assert
    assert version == read_version == 2
    assert [n for n, _ in arrays] == ["w", "b"]
    assert all(np.all(a == 2.0) for _, a in arrays)
    reader.close()
    board.close()


def test_the_board_refuses_weights_of_another_shape() -> None:
    board = WeightsBoard(BoardLayout.of(weights(0.0)))
    with pytest.raises(ValueError, match="names and shapes"):
        board.publish([("w", np.zeros((2, 3), dtype=np.float32)), ("b", np.zeros(2))])
    board.close()


def test_stop_requests_reach_attached_readers() -> None:
    board = WeightsBoard(BoardLayout.of(weights(0.0)))
    reader = WeightsBoard(board.layout, name=board.name)

    board.request_stop()

    assert reader.stop_requested
    reader.close()
    board.close()


def test_closing_the_owner_unlinks_its_segments_and_twice_is_harmless() -> None:
    # prepare
    ring = SlotRing(RingLayout(num_slots=1, rows_per_slot=2, episodes_per_slot=1, obs_shape=(3,)))
    board = WeightsBoard(BoardLayout.of(weights(0.0)))
    names = [ring.name, board.name]
    assert all(name.startswith(SEGMENT_PREFIX) for name in names)
    assert all((SHM / name).exists() for name in names)

    # act
    ring.close()
    board.close()
    ring.close()
    board.close()

    # assert
    assert not any((SHM / name).exists() for name in names)
