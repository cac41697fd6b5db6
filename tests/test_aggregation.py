"""Aggregation math against hand-computed values, plus its invariants as properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedrl.server.strategy.aggregate import (
    apply_update,
    clip_by_norm,
    staleness_weight,
    update_weight,
)
from fedrl.server.strategy.fedavg import FedAvg
from fedrl.server.strategy.median import Median
from fedrl.server.strategy.registry import STRATEGY_NAMES, make_strategy
from fedrl.server.strategy.strategy import Strategy
from fedrl.server.strategy.trimmed_mean import TrimmedMean


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def column(values: list[float]) -> list[list[np.ndarray]]:
    """One single-coordinate delta per value."""
    return [[f32(v)] for v in values]


# Weights ---------------------------------------------------------------------


def test_staleness_weight_is_inverse_square_root_of_one_plus_staleness() -> None:
    assert staleness_weight(0) == 1.0
    assert staleness_weight(3) == 0.5
    assert staleness_weight(8) == pytest.approx(1 / 3)


def test_staleness_weight_follows_the_exponent() -> None:
    assert staleness_weight(1, exponent=1.0) == 0.5
    assert staleness_weight(5, exponent=0.0) == 1.0


def test_staleness_weight_refuses_negative_staleness_and_exponent() -> None:
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        staleness_weight(-1)
    with pytest.raises(ValueError, match="exponent"):
        staleness_weight(1, exponent=-0.5)
    with pytest.raises(TypeError, match="integer"):
        staleness_weight(1.5)  # type: ignore[arg-type]


def test_update_weight_is_samples_times_staleness_discount() -> None:
    assert update_weight(100, 3, max_samples=1000) == 50.0


def test_update_weight_caps_claimed_samples() -> None:
    assert update_weight(5000, 0, max_samples=1000) == 1000.0
    assert update_weight(5000, 3, max_samples=1000) == 500.0


def test_update_weight_refuses_updates_without_samples() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        update_weight(0, 0, max_samples=10)
    with pytest.raises(ValueError, match="max_samples"):
        update_weight(1, 0, max_samples=0)


# Clipping --------------------------------------------------------------------


def test_clip_by_norm_scales_to_the_bound_over_all_tensors() -> None:
    delta = [f32(3.0, 0.0), f32(4.0)]

    clipped, norm = clip_by_norm(delta, 1.0)

    assert norm == 5.0
    np.testing.assert_allclose(clipped[0], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(clipped[1], [0.8], rtol=1e-6)
    assert all(t.dtype == np.float32 for t in clipped)


def test_clip_by_norm_leaves_a_small_delta_unchanged() -> None:
    delta = [f32(0.3), f32(0.4)]

    clipped, norm = clip_by_norm(delta, 1.0)

    assert norm == pytest.approx(0.5)
    assert all(np.array_equal(a, b) for a, b in zip(clipped, delta, strict=True))


def test_clip_by_norm_refuses_non_finite_input_and_bad_bound() -> None:
    with pytest.raises(ValueError, match="NaN or infinity"):
        clip_by_norm([f32(1.0, math.inf)], 1.0)
    with pytest.raises(ValueError, match="max_norm"):
        clip_by_norm([f32(1.0)], 0.0)


# Strategies --------------------------------------------------------------------


def test_weighted_mean_of_two_participants() -> None:
    a = [f32(1.0, 2.0), f32(10.0)]
    b = [f32(3.0, 4.0), f32(-10.0)]

    result = FedAvg().aggregate([a, b], [1.0, 3.0])

    np.testing.assert_array_equal(result[0], f32(2.5, 3.5))
    np.testing.assert_array_equal(result[1], f32(-5.0))
    assert all(t.dtype == np.float32 for t in result)


def test_weighted_mean_keeps_tensor_shapes() -> None:
    a = [np.ones((2, 3), np.float32), np.ones((), np.float32), np.ones((0, 4), np.float32)]

    result = FedAvg().aggregate([a, a], [1.0, 1.0])

    assert [t.shape for t in result] == [(2, 3), (), (0, 4)]


def test_trimmed_mean_removes_an_outlier_coordinate() -> None:
    # Coordinate 0: participant 4 is the outlier; coordinate 1: participant 0.
    deltas = [
        [f32(1.0, -100.0)],
        [f32(2.0, 2.0)],
        [f32(3.0, 3.0)],
        [f32(4.0, 4.0)],
        [f32(500.0, 5.0)],
    ]

    result = TrimmedMean(trim_fraction=0.2).aggregate(deltas, [1.0] * 5)

    # Per coordinate the smallest and largest value go: both means are of {2, 3, 4}.
    np.testing.assert_array_equal(result[0], f32(3.0, 3.0))


def test_trimmed_mean_weights_the_values_it_keeps() -> None:
    deltas = column([1.0, 2.0, 3.0, 4.0, 100.0])

    result = TrimmedMean(trim_fraction=0.2).aggregate(deltas, [9.0, 1.0, 1.0, 2.0, 9.0])

    # Kept 2, 3, 4 with weights 1, 1, 2: (2 + 3 + 8) / 4.
    np.testing.assert_array_equal(result[0], f32(3.25))


def test_trimmed_mean_with_nothing_to_trim_is_the_weighted_mean() -> None:
    deltas = column([1.0, 3.0])

    result = TrimmedMean(trim_fraction=0.2).aggregate(deltas, [1.0, 3.0])

    np.testing.assert_array_equal(result[0], f32(2.5))


def test_trimmed_mean_refuses_a_fraction_that_trims_everything() -> None:
    with pytest.raises(ValueError, match=r"trim_fraction must be in \[0, 0.5\)"):
        TrimmedMean(trim_fraction=0.5)


def test_median_of_an_odd_count_ignores_weights() -> None:
    deltas = [[f32(1.0, 9.0)], [f32(7.0, 8.0)], [f32(3.0, -1.0)]]

    result = Median().aggregate(deltas, [100.0, 1.0, 1.0])

    np.testing.assert_array_equal(result[0], f32(3.0, 8.0))


def test_median_of_an_even_count_is_the_mean_of_the_middle_pair() -> None:
    deltas = column([1.0, 10.0, 2.0, 4.0])

    result = Median().aggregate(deltas, [1.0] * 4)

    np.testing.assert_array_equal(result[0], f32(3.0))


def reference(name: str, values: np.ndarray, weights: list[float]) -> np.ndarray:
    """Straightforward float64 versions of the strategies, over (K, N) values."""
    wide = values.astype(np.float64)
    if name == "mean":
        return np.asarray(np.average(wide, axis=0, weights=weights))
    ordered = np.sort(wide, axis=0)
    if name == "median":
        return np.asarray((ordered[1] + ordered[2]) / 2)
    # Trimmed mean of four with one cut per end: the middle two, each with its weight.
    order = np.argsort(wide, axis=0, kind="stable")[1:3]
    w = np.asarray(weights)[order]
    return np.asarray((np.take_along_axis(wide, order, axis=0) * w).sum(axis=0) / w.sum(axis=0))


@pytest.mark.parametrize("strategy", [FedAvg(), TrimmedMean(trim_fraction=0.25), Median()])
def test_strategies_match_a_float64_reference_across_block_boundaries(
    strategy: Strategy,
) -> None:
    # 70_000 coordinates span two blocks of the coordinate-wise kernels.
    values = np.random.default_rng(7).standard_normal((4, 70_000)).astype(np.float32)
    weights = [1.0, 2.0, 3.0, 4.0]
    deltas = [[row.reshape(700, 100)] for row in values]

    result = strategy.aggregate(deltas, weights)

    expected = reference(strategy.name, values, weights)
    np.testing.assert_allclose(result[0].reshape(-1), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("strategy", [FedAvg(), TrimmedMean(), Median()])
def test_strategies_refuse_mismatched_or_non_finite_input(strategy: Strategy) -> None:
    good = [f32(1.0, 2.0), f32(3.0)]
    cases: list[tuple[list[list[np.ndarray]], list[float], str]] = [
        ([], [], "no deltas"),
        ([good, good], [1.0], "2 deltas but 1 weights"),
        ([good, [f32(1.0, 2.0)]], [1.0, 1.0], "delta 1 has 1 tensors, expected 2"),
        ([good, [f32(1.0), f32(3.0)]], [1.0, 1.0], r"delta 1, tensor 0: shape \(1,\)"),
        ([good, [f32(1.0, math.nan), f32(3.0)]], [1.0, 1.0], "delta 1, tensor 0: holds NaN"),
        ([good, good], [1.0, 0.0], "weight 1 must be finite and positive"),
        ([good, good], [1.0, math.inf], "weight 1 must be finite and positive"),
        ([good, [np.array([1, 2]), f32(3.0)]], [1.0, 1.0], "not floating"),
    ]
    for deltas, weights, message in cases:
        with pytest.raises(ValueError, match=message):
            strategy.aggregate(deltas, weights)


def test_make_strategy_builds_each_named_strategy() -> None:
    assert set(STRATEGY_NAMES) == {"mean", "trimmed_mean", "median"}
    assert isinstance(make_strategy("mean"), FedAvg)
    trimmed = make_strategy("trimmed_mean", trim_fraction=0.1)
    assert isinstance(trimmed, TrimmedMean)
    assert trimmed.trim_fraction == 0.1
    assert isinstance(make_strategy("median"), Median)


def test_make_strategy_names_the_valid_choices() -> None:
    with pytest.raises(ValueError, match="valid names: mean, trimmed_mean, median"):
        make_strategy("krum")
    with pytest.raises(ValueError, match="takes no option trim_fraction; its options: none"):
        make_strategy("median", trim_fraction=0.1)


# Applying ----------------------------------------------------------------------


def test_apply_update_adds_the_scaled_aggregate() -> None:
    result = apply_update([f32(1.0, 1.0)], [f32(2.0, -4.0)], server_lr=0.5)

    np.testing.assert_array_equal(result[0], f32(2.0, -1.0))
    assert result[0].dtype == np.float32


def test_apply_update_refuses_overflow_mismatch_and_bad_rate() -> None:
    big = float(np.finfo(np.float32).max)
    with pytest.raises(ValueError, match="overflows float32"):
        apply_update([f32(big)], [f32(big)], server_lr=1.0)
    with pytest.raises(ValueError, match="aggregate has 2 tensors, expected 1"):
        apply_update([f32(1.0)], [f32(1.0), f32(1.0)], server_lr=1.0)
    with pytest.raises(ValueError, match="server_lr"):
        apply_update([f32(1.0)], [f32(1.0)], server_lr=0.0)


def test_float64_input_gives_float32_output() -> None:
    deltas = [[np.array([1.0, 2.0])], [np.array([3.0, 4.0])]]

    result = FedAvg().aggregate(deltas, [1.0, 1.0])

    assert result[0].dtype == np.float32
    np.testing.assert_array_equal(result[0], f32(2.0, 3.0))


def test_float64_values_beyond_float32_are_refused() -> None:
    with pytest.raises(ValueError, match="beyond float32's range"):
        clip_by_norm([np.array([1e300])], 1.0)


# Properties ----------------------------------------------------------------------

STRATEGIES = [FedAvg(), TrimmedMean(trim_fraction=0.2), TrimmedMean(trim_fraction=0.4), Median()]

finite32 = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_subnormal=False)
# Few distinct values, so that ties (where order could leak in) are common.
tied32 = st.sampled_from([-2.0, -1.0, 0.0, 1.0, 2.5])


@st.composite
def deltas_and_weights(
    draw: st.DrawFn, elements: st.SearchStrategy[float] = finite32
) -> tuple[list[list[np.ndarray]], list[float]]:
    count = draw(st.integers(1, 7))
    shapes = draw(st.lists(hnp.array_shapes(min_dims=0, max_dims=2, max_side=4), max_size=3))
    deltas = [
        [draw(hnp.arrays(np.float32, shape, elements=elements)) for shape in shapes]
        for _ in range(count)
    ]
    # Repeated weights make ties in (value, weight); arbitrary ones test the arithmetic.
    weight = st.one_of(st.sampled_from([0.5, 1.0, 2.0, 7.0]), st.floats(1e-3, 1e3))
    weights = draw(st.lists(weight, min_size=count, max_size=count))
    return deltas, weights


@settings(max_examples=60, deadline=None)
@given(case=deltas_and_weights(), strategy=st.sampled_from(STRATEGIES))
def test_identical_deltas_aggregate_to_that_delta(
    case: tuple[list[list[np.ndarray]], list[float]], strategy: Strategy
) -> None:
    deltas, weights = case
    same = [deltas[0]] * len(deltas)

    result = strategy.aggregate(same, weights)

    assert all(np.array_equal(r, d) for r, d in zip(result, deltas[0], strict=True))


@settings(max_examples=60, deadline=None)
@given(case=deltas_and_weights(), strategy=st.sampled_from(STRATEGIES))
def test_every_coordinate_stays_within_its_inputs(
    case: tuple[list[list[np.ndarray]], list[float]], strategy: Strategy
) -> None:
    deltas, weights = case

    result = strategy.aggregate(deltas, weights)

    for index, tensor in enumerate(result):
        stacked = np.stack([d[index] for d in deltas])
        assert (tensor >= stacked.min(axis=0)).all()
        assert (tensor <= stacked.max(axis=0)).all()


@settings(max_examples=60, deadline=None)
@given(
    case=deltas_and_weights(elements=st.one_of(tied32, finite32)),
    strategy=st.sampled_from(STRATEGIES[1:]),
    data=st.data(),
)
def test_robust_strategies_ignore_update_order_even_with_ties(
    case: tuple[list[list[np.ndarray]], list[float]], strategy: Median, data: st.DataObject
) -> None:
    deltas, weights = case
    order = data.draw(st.permutations(range(len(deltas))))

    before = strategy.aggregate(deltas, weights)
    after = strategy.aggregate([deltas[i] for i in order], [weights[i] for i in order])

    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


@settings(max_examples=40, deadline=None)
@given(case=deltas_and_weights(), data=st.data())
def test_weighted_mean_ignores_update_order_up_to_rounding(
    case: tuple[list[list[np.ndarray]], list[float]], data: st.DataObject
) -> None:
    deltas, weights = case
    order = data.draw(st.permutations(range(len(deltas))))

    before = FedAvg().aggregate(deltas, weights)
    after = FedAvg().aggregate([deltas[i] for i in order], [weights[i] for i in order])

    for a, b in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    delta=st.lists(
        hnp.arrays(np.float32, hnp.array_shapes(max_dims=2), elements=finite32), max_size=3
    ),
    bound=st.floats(1e-3, 1e3),
)
def test_clipping_scales_down_exactly_the_deltas_over_the_bound(
    delta: list[np.ndarray], bound: float
) -> None:
    clipped, norm = clip_by_norm(delta, bound)

    wide = [t.astype(np.float64) for t in delta]
    assert norm == pytest.approx(math.sqrt(sum(float(np.sum(t * t)) for t in wide)), rel=1e-9)
    scale = min(1.0, bound / norm) if norm > 0 else 1.0
    for before, after in zip(wide, clipped, strict=True):
        np.testing.assert_allclose(after, before * scale, rtol=1e-6, atol=1e-30)
    new_norm = math.sqrt(sum(float(np.sum(t.astype(np.float64) ** 2)) for t in clipped))
    assert new_norm <= bound * (1 + 1e-6) or norm <= bound
