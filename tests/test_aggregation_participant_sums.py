"""ParticipantSums and the blockwise weighted mean, fed update by update as the aggregator does."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrl.server.strategy.aggregate import ParticipantSums
from fedrl.server.strategy.fedavg import FedAvg
from fedrl.server.strategy.median import Median
from fedrl.server.strategy.trimmed_mean import TrimmedMean

Update = tuple[str, list[np.ndarray], float]


def updates_of(seed: int, participants: Sequence[str]) -> list[Update]:
    rng = np.random.default_rng(seed)
    return [
        (
            pid,
            [
                rng.standard_normal((3, 4)).astype(np.float32),
                rng.standard_normal(5).astype(np.float32),
            ],
            float(rng.uniform(0.1, 10.0)),
        )
        for pid in participants
    ]


def summed_by_participant(updates: Sequence[Update]) -> tuple[list[list[np.ndarray]], list[float]]:
    """Each participant's deltas and weights added up, as the aggregator has always done."""
    sums: dict[str, tuple[list[np.ndarray], float]] = {}
    for pid, delta, weight in updates:
        if pid in sums:
            total, total_weight = sums[pid]
            sums[pid] = ([a + b for a, b in zip(total, delta, strict=True)], total_weight + weight)
        else:
            sums[pid] = (delta, weight)
    return [d for d, _ in sums.values()], [w for _, w in sums.values()]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    participants=st.lists(st.sampled_from(["a", "b", "Макар", "d"]), min_size=1, max_size=10),
)
def test_weighted_mean_of_participant_sums_matches_a_float64_reference(
    seed: int, participants: list[str]
) -> None:
    updates = updates_of(seed, participants)
    sums = ParticipantSums(FedAvg().aggregate)

    for pid, delta, weight in updates:
        sums.add(pid, delta, weight)
    got = sums.result()

    deltas, weights = summed_by_participant(updates)
    w = np.asarray(weights) / sum(weights)
    for index, tensor in enumerate(got):
        reference = sum(wk * d[index].astype(np.float64) for wk, d in zip(w, deltas, strict=True))
        assert tensor.dtype == np.float32
        np.testing.assert_allclose(tensor, reference, rtol=1e-6, atol=1e-7)


def test_weighted_mean_over_several_blocks_of_identical_deltas_is_exactly_that_delta() -> None:
    # 200 001 values: four blocks and a short one, so every block boundary is crossed.
    delta = np.random.default_rng(5).standard_normal(200_001).astype(np.float32)

    mean = FedAvg().aggregate([[delta]] * 3, [0.3, 7.0, 1.0 / 3.0])[0]

    assert mean.tobytes() == delta.tobytes()


def test_weighted_mean_names_the_delta_that_is_not_finite() -> None:
    good = np.ones(70_000, dtype=np.float32)
    bad = good.copy()
    bad[-1] = np.inf

    with pytest.raises(ValueError, match="delta 1, tensor 0: holds NaN or infinity"):
        FedAvg().aggregate([[good], [bad]], [1.0, 1.0])


def test_participant_sums_do_not_change_the_arrays_they_were_given() -> None:
    updates = updates_of(7, ["a", "a", "b"])
    copies = [[t.copy() for t in delta] for _, delta, _ in updates]
    sums = ParticipantSums(FedAvg().aggregate)

    for pid, delta, weight in updates:
        sums.add(pid, delta, weight)
    sums.result()

    for (_, delta, _), copy in zip(updates, copies, strict=True):
        for tensor, before in zip(delta, copy, strict=True):
            assert tensor.tobytes() == before.tobytes()


def test_participant_sums_refuse_a_delta_of_another_shape() -> None:
    sums = ParticipantSums(FedAvg().aggregate)
    sums.add("a", [np.ones(3, dtype=np.float32)], 1.0)

    with pytest.raises(ValueError, match="shape"):
        sums.add("a", [np.ones(4, dtype=np.float32)], 1.0)


@pytest.mark.parametrize("strategy", [Median(), TrimmedMean(trim_fraction=0.25)])
def test_robust_strategies_see_one_summed_delta_per_participant(
    strategy: Median | TrimmedMean,
) -> None:
    updates = updates_of(3, ["a", "b", "a", "c", "d", "b", "e"])
    sums = ParticipantSums(strategy.aggregate)

    for pid, delta, weight in updates:
        sums.add(pid, delta, weight)

    expected = strategy.aggregate(*summed_by_participant(updates))
    for got, want in zip(sums.result(), expected, strict=True):
        assert got.tobytes() == want.tobytes()
