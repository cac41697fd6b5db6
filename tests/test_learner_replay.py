"""PrioritizedReplay and LearnerTransitions: sampling laws, weights, ring-buffer order, checks."""

from __future__ import annotations

import numpy as np
import pytest

from fedrl.client.training.replay import PrioritizedReplay, SumTree
from fedrl.client.training.transitions import LearnerTransitions

OBS_SHAPE = (3,)


def _batch(
    rewards: list[float] | np.ndarray, obs_shape: tuple[int, ...] = OBS_SHAPE
) -> LearnerTransitions:
    """Transitions whose reward doubles as an id, so tests can tell which were kept."""
    reward = np.asarray(rewards, dtype=np.float32)
    size = reward.shape[0]
    obs = np.broadcast_to(reward.reshape(size, *([1] * len(obs_shape))), (size, *obs_shape))
    return LearnerTransitions(
        obs=obs.astype(np.float32),
        action=np.zeros(size, dtype=np.int64),
        reward=reward,
        next_obs=(obs + 0.5).astype(np.float32),
        discount=np.full(size, 0.99, dtype=np.float32),
    )


def _chi_square(counts: np.ndarray, expected_probabilities: np.ndarray) -> float:
    expected = expected_probabilities * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# Upper 0.1% points of the chi-square distribution: a correct sampler fails
# these one time in a thousand seeds; the seeds below are fixed.
CHI_SQUARE_999 = {3: 16.27, 9: 27.88}


def test_prioritized_sampling_frequencies_follow_priority_to_the_alpha() -> None:
    alpha = 0.6
    replay = PrioritizedReplay(8, OBS_SHAPE, alpha=alpha, eps=1e-6, seed=1)
    replay.add(_batch([0, 1, 2, 3]))
    td_abs = np.array([0.5, 1.0, 2.0, 4.0])
    replay.update_priorities(np.arange(4), td_abs)

    counts = np.zeros(4)
    for _ in range(400):
        sampled = replay.sample(64, beta=1.0)
        counts += np.bincount(sampled.indices, minlength=4)

    priorities = (td_abs + 1e-6) ** alpha
    statistic = _chi_square(counts, priorities / priorities.sum())
    assert statistic < CHI_SQUARE_999[3], (counts, statistic)


def test_sum_tree_draws_each_leaf_in_proportion_to_its_value() -> None:
    rng = np.random.default_rng(7)
    tree = SumTree(10)
    values = rng.uniform(0.1, 5.0, size=10)
    tree.set(np.arange(10), values)

    draws = tree.find(rng.uniform(0.0, tree.total, size=50_000))

    assert tree.total == pytest.approx(values.sum())
    statistic = _chi_square(np.bincount(draws, minlength=10), values / values.sum())
    assert statistic < CHI_SQUARE_999[9], statistic


def test_sum_tree_maps_each_target_to_the_leaf_whose_interval_holds_it() -> None:
    tree = SumTree(5)
    tree.set(np.arange(3), np.array([1.0, 2.0, 3.0]))

    # Intervals: leaf 0 [0, 1), leaf 1 [1, 3), leaf 2 [3, 6).
    slots = tree.find(np.array([0.0, 0.999, 1.0, 2.999, 3.0, 5.999]))

    np.testing.assert_array_equal(slots, [0, 0, 1, 1, 2, 2])


def test_sum_tree_keeps_every_parent_the_sum_of_its_children() -> None:
    rng = np.random.default_rng(2)
    tree = SumTree(1000)
    values = np.zeros(1000)
    for _ in range(20):
        slots = rng.integers(0, 1000, size=64)  # with repeats
        fresh = rng.random(64)
        tree.set(slots, fresh)
        values[slots] = tree.get(slots)

    assert tree.total == pytest.approx(values.sum())
    assert set(np.unique(tree.get(slots))) <= set(fresh)


def test_a_partly_filled_buffer_never_yields_an_unwritten_slot() -> None:
    replay = PrioritizedReplay(1000, OBS_SHAPE, seed=0)
    replay.add(_batch([0, 1, 2]))

    sampled = replay.sample(10_000, beta=1.0)

    assert sampled.indices.max() == 2


def test_importance_weights_are_inverse_probability_to_the_beta_normalised_by_max() -> None:
    alpha, beta = 1.0, 0.5
    replay = PrioritizedReplay(4, OBS_SHAPE, alpha=alpha, eps=1e-6, seed=0)
    replay.add(_batch([0, 1, 2, 3]))
    td_abs = np.array([1.0, 2.0, 3.0, 4.0])
    replay.update_priorities(np.arange(4), td_abs)

    sampled = replay.sample(256, beta=beta)

    probabilities = (td_abs + 1e-6) / (td_abs + 1e-6).sum()
    weights = (4 * probabilities[sampled.indices]) ** -beta
    np.testing.assert_allclose(sampled.weights, weights / weights.max(), rtol=1e-5)
    assert sampled.weights.dtype == np.float32
    assert sampled.weights.max() == pytest.approx(1.0)


def test_sampled_rows_match_their_indices() -> None:
    replay = PrioritizedReplay(16, OBS_SHAPE, seed=3)
    replay.add(_batch(np.arange(10)))

    sampled = replay.sample(32, beta=0.4)

    np.testing.assert_array_equal(sampled.batch.reward, sampled.indices.astype(np.float32))
    np.testing.assert_array_equal(sampled.batch.obs[:, 0], sampled.batch.reward)
    np.testing.assert_array_equal(sampled.batch.next_obs[:, 0], sampled.batch.reward + 0.5)
    sampled.batch.validate(OBS_SHAPE)


def test_new_transitions_get_the_highest_priority_seen() -> None:
    replay = PrioritizedReplay(8, OBS_SHAPE, alpha=1.0, eps=1e-6, seed=0)
    replay.add(_batch([0, 1]))
    replay.update_priorities(np.array([0, 1]), np.array([9.0, 0.1]))

    replay.add(_batch([2]))

    counts = np.bincount(replay.sample(3000, beta=1.0).indices, minlength=3)
    # Slot 2 got priority 9 like slot 0, so the two are drawn about equally.
    assert abs(int(counts[2]) - int(counts[0])) < 60
    assert counts[1] < counts[0] / 20


def test_wraparound_overwrites_the_oldest_transitions() -> None:
    replay = PrioritizedReplay(5, OBS_SHAPE, seed=0)
    replay.add(_batch([0, 1, 2]))

    replay.add(_batch([3, 4, 5, 6]))

    assert len(replay) == 5
    kept = replay.sample(2000, beta=1.0).batch.reward
    assert set(kept.tolist()) == {2.0, 3.0, 4.0, 5.0, 6.0}


def test_a_batch_larger_than_the_buffer_keeps_its_newest_rows() -> None:
    replay = PrioritizedReplay(4, OBS_SHAPE, seed=0)

    replay.add(_batch(np.arange(10)))

    assert len(replay) == 4
    assert set(replay.sample(1000, beta=1.0).batch.reward.tolist()) == {6.0, 7.0, 8.0, 9.0}


def test_uniform_mode_samples_evenly_with_unit_weights() -> None:
    replay = PrioritizedReplay(8, OBS_SHAPE, prioritized=False, seed=5)
    replay.add(_batch(np.arange(4)))
    # Priorities are ignored in uniform mode, however skewed.
    replay.update_priorities(np.arange(4), np.array([100.0, 0.0, 0.0, 0.0]))

    sampled = replay.sample(20_000, beta=0.4)

    np.testing.assert_array_equal(sampled.weights, np.ones(20_000, dtype=np.float32))
    counts = np.bincount(sampled.indices, minlength=4)
    assert _chi_square(counts, np.full(4, 0.25)) < CHI_SQUARE_999[3]


def test_foreign_flag_is_stored_per_transition() -> None:
    replay = PrioritizedReplay(8, OBS_SHAPE, prioritized=False, seed=0)
    replay.add(_batch([0, 1]))
    replay.add(_batch([2, 3]), foreign=True)

    sampled = replay.sample(200, beta=1.0)

    np.testing.assert_array_equal(sampled.foreign, sampled.batch.reward >= 2.0)


def test_sampling_an_empty_buffer_is_an_error() -> None:
    replay = PrioritizedReplay(8, OBS_SHAPE, seed=0)

    with pytest.raises(ValueError, match="empty"):
        replay.sample(4, beta=1.0)


def test_adding_a_batch_of_the_wrong_shape_names_the_column() -> None:
    replay = PrioritizedReplay(8, OBS_SHAPE, seed=0)

    with pytest.raises(ValueError, match=r"LearnerTransitions\.obs has shape \(2, 4\)"):
        replay.add(_batch([0, 1], obs_shape=(4,)))
    assert len(replay) == 0


def test_priority_updates_outside_the_filled_range_are_refused() -> None:
    replay = PrioritizedReplay(8, OBS_SHAPE, seed=0)
    replay.add(_batch([0, 1]))

    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        replay.update_priorities(np.array([5]), np.array([1.0]))
    with pytest.raises(ValueError, match="NaN"):
        replay.update_priorities(np.array([0]), np.array([np.nan]))


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("action", np.zeros(2, dtype=np.int32), "action has dtype int32"),
        ("reward", np.array([0.0, np.inf], dtype=np.float32), "reward holds a NaN"),
        ("discount", np.array([0.5, 1.5], dtype=np.float32), r"discount must lie in \[0, 1\]"),
        ("action", np.array([0, -1], dtype=np.int64), "negative action"),
    ],
)
def test_transition_batch_validation_says_what_is_wrong(
    column: str, value: np.ndarray, message: str
) -> None:
    columns = vars(_batch([0, 1])) | {column: value}

    with pytest.raises(ValueError, match=message):
        LearnerTransitions(**columns).validate(OBS_SHAPE)


def test_concat_joins_batches_end_to_end() -> None:
    joined = LearnerTransitions.concat([_batch([0, 1]), _batch([2])])

    assert len(joined) == 3
    np.testing.assert_array_equal(joined.reward, [0.0, 1.0, 2.0])
    joined.validate(OBS_SHAPE)
