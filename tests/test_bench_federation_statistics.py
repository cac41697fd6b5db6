"""bench.federation.statistics on hand values: IQM, stratified bootstrap, ratio intervals."""

from __future__ import annotations

import numpy as np
import pytest

from bench.federation.statistics import (
    Estimate,
    describe_speedup,
    iqm,
    iqm_interval,
    ratio_interval,
    stratified_resamples,
)


def test_the_iqm_cuts_the_lowest_and_highest_quarter() -> None:
    assert iqm(np.arange(1, 9)) == 4.5  # 3, 4, 5, 6
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8, 9, 1_000]) == 5.5  # 3 to 8: the outlier is cut
    assert iqm([1, 2, 3, 4, 100]) == 3.0  # one cut from each end of five
    assert iqm([4, 1, 3, 2]) == 2.5  # unsorted input


def test_the_iqm_of_fewer_than_four_values_is_their_mean() -> None:
    assert iqm([5]) == 5.0
    assert iqm([1, 3]) == 2.0
    assert iqm([1, 2, 9]) == 4.0


def test_the_iqm_of_runs_by_tasks_pools_every_score() -> None:
    assert iqm([[1, 10], [2, 20], [3, 30], [4, 40]]) == iqm([1, 2, 3, 4, 10, 20, 30, 40])


def test_the_iqm_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        iqm([])


def test_resamples_draw_each_tasks_runs_from_that_task_alone() -> None:
    # prepare: task 0 scores below 10, task 1 above 100.
    scores = np.array([[1.0, 101.0], [2.0, 102.0], [3.0, 103.0]])

    draws = stratified_resamples(scores, np.random.default_rng(0), reps=500).reshape(500, 3, 2)

    assert set(np.unique(draws[:, :, 0])) == {1.0, 2.0, 3.0}
    assert set(np.unique(draws[:, :, 1])) == {101.0, 102.0, 103.0}


def test_the_interval_of_two_runs_is_the_percentiles_of_every_resample() -> None:
    # Two runs, 0 and 10: resampled means are 0 (1/4), 5 (1/2) and 10 (1/4), so the
    # 2.5th and 97.5th percentiles are 0 and 10.
    estimate = iqm_interval([0.0, 10.0])

    assert estimate == Estimate(5.0, 0.0, 10.0)


def test_identical_runs_have_an_interval_of_no_width() -> None:
    assert iqm_interval([7.0] * 5) == Estimate(7.0, 7.0, 7.0)


def test_the_same_scores_give_the_same_interval() -> None:
    scores = [3_000, 4_250, 12_000, 5_500, 2_750, 8_000]

    assert iqm_interval(scores) == iqm_interval(list(scores))


def test_a_ratio_of_constant_runs_is_exact() -> None:
    speedup = ratio_interval([1_000] * 5, [500] * 5)

    assert speedup == Estimate(2.0, 2.0, 2.0)
    assert speedup.gain == "gain"
    assert "no measurable gain" not in describe_speedup(speedup)


def test_the_ratio_interval_contains_the_true_ratio() -> None:
    # prepare: the group needs exactly half of every reference seed's steps.
    reference = np.array([800, 1_000, 1_200, 1_400, 1_600, 900, 1_100, 1_300, 1_500, 1_700])

    speedup = ratio_interval(reference, reference / 2)

    assert speedup.value == pytest.approx(2.0)
    assert speedup.low < 2.0 < speedup.high
    assert speedup.contains(2.0)


def test_a_ratio_whose_interval_holds_one_is_no_measurable_gain() -> None:
    reference = [2_000, 3_000, 12_000, 4_000, 5_000]
    group = [1_500, 6_000, 3_500, 12_000, 2_500]

    speedup = ratio_interval(reference, group)

    assert speedup.low < 1.0 < speedup.high
    assert speedup.gain == "no measurable gain"
    assert describe_speedup(speedup).endswith("x no measurable gain")


def test_a_ratio_whose_interval_lies_below_one_is_a_loss() -> None:
    speedup = ratio_interval([1_000, 1_100, 1_200], [4_000, 4_100, 4_200])

    assert speedup.high < 1.0
    assert speedup.gain == "loss"
    assert "measurable loss" in describe_speedup(speedup)


def test_ratios_need_positive_finite_values() -> None:
    with pytest.raises(ValueError, match="positive"):
        ratio_interval([1_000], [0])
    with pytest.raises(ValueError, match="finite"):
        iqm_interval([1_000, float("inf")])
    with pytest.raises(ValueError, match="not empty"):
        iqm_interval([])
