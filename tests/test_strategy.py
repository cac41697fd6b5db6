"""The Strategy's rule against hand-computed values: admission, weight, clipping, step, buffer."""

from __future__ import annotations

import numpy as np
import pytest

from fedrl.server.refusals import InvalidRequestError, PreconditionError
from fedrl.server.strategy.aggregate import apply_update, server_step
from fedrl.server.strategy.fedavg import FedAvg
from fedrl.server.strategy.median import Median
from fedrl.server.strategy.registry import strategy_from_settings
from fedrl.server.strategy.strategy import Rule
from fedrl.server.strategy.trimmed_mean import TrimmedMean


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_without_momentum_the_step_is_global_plus_lr_times_aggregate_and_keeps_no_velocity() -> (
    None
):
    strategy = FedAvg(Rule(server_lr=0.5))

    new, velocity = strategy.step([f32(1.0, 1.0)], [f32(2.0, -4.0)], None)

    assert new[0].tolist() == [2.0, -1.0]
    assert velocity is None


def test_momentum_carries_the_velocity_from_version_to_version() -> None:
    # velocity = 0.5 * velocity + aggregate; global += velocity (lr 1):
    # v1 = 2, g1 = 2; v2 = 0.5 * 2 + 1 = 2, g2 = 4; v3 = 0.5 * 2 - 4 = -3, g3 = 1.
    strategy = FedAvg(Rule(server_momentum=0.5))
    model, velocity = [f32(0.0)], None
    seen = []

    for aggregate in (2.0, 1.0, -4.0):
        model, velocity = strategy.step(model, [f32(aggregate)], velocity)
        assert velocity is not None
        seen.append((float(model[0][0]), float(velocity[0][0])))

    assert seen == [(2.0, 2.0), (4.0, 2.0), (1.0, -3.0)]


def test_the_step_without_momentum_is_exactly_apply_update() -> None:
    rng = np.random.default_rng(3)
    model = [rng.standard_normal(1000).astype(np.float32)]
    aggregate = [rng.standard_normal(1000).astype(np.float32)]

    new, _ = server_step(model, aggregate, learning_rate=0.3)

    assert new[0].tobytes() == apply_update(model, aggregate, server_lr=0.3)[0].tobytes()


def test_a_velocity_that_overflows_is_refused() -> None:
    with pytest.raises(ValueError, match="velocity tensor 0"):
        server_step([f32(0.0)], [f32(3e38)], learning_rate=1.0, momentum=0.9, velocity=[f32(3e38)])


def test_weight_is_capped_samples_times_the_staleness_discount() -> None:
    strategy = FedAvg(Rule(max_samples=100, staleness_exponent=0.5))

    # min(400, 100) * (1 + 3) ** -0.5 = 50
    assert strategy.weight(400, 3) == 50.0
    assert strategy.weight(10, 0) == 10.0


def test_staleness_past_the_maximum_is_refused_and_an_unknown_base_is_invalid() -> None:
    strategy = FedAvg(Rule(max_staleness=2))

    assert strategy.staleness(3, 5) == 2
    with pytest.raises(PreconditionError, match="3 versions stale"):
        strategy.staleness(2, 5)
    with pytest.raises(InvalidRequestError, match="base_version 6 does not exist"):
        strategy.staleness(6, 5)


def test_the_absolute_norm_bound_refuses_even_before_a_model_exists() -> None:
    strategy = FedAvg(Rule(max_update_norm=10.0))

    strategy.check_norm(10.0, version=-1, model=None)
    with pytest.raises(InvalidRequestError, match="--max-update-norm"):
        strategy.check_norm(10.5, version=-1, model=None)


def test_restored_norms_set_the_relative_bound() -> None:
    # Four accepted norms of 1: the reference is their median, 1, so 20 x 1 is the bound
    # (the model's own norm, 0.1, is far below it and does not count).
    strategy = FedAvg(Rule(update_norm_factor=20.0))
    strategy.restore_norms([1.0, 1.0, 1.0, 1.0])
    model = [f32(0.1)]

    strategy.check_norm(20.0, version=3, model=model)
    with pytest.raises(InvalidRequestError, match=r"exceeds 20 x the median norm 1"):
        strategy.check_norm(20.5, version=3, model=model)


def test_clipping_scales_an_update_to_the_clip_norm_and_leaves_smaller_ones() -> None:
    strategy = FedAvg(Rule(clip_norm=1.0))

    (clipped,) = strategy.clip([f32(3.0, 4.0)])
    (small,) = strategy.clip([f32(0.3, 0.4)])

    np.testing.assert_allclose(clipped, [0.6, 0.8], rtol=1e-6)
    assert small.tolist() == f32(0.3, 0.4).tolist()


def test_k_is_the_buffer_size_or_the_pushing_participants_at_least_one() -> None:
    assert FedAvg(Rule(buffer_size=3)).buffer_target(7) == 3
    assert FedAvg(Rule()).buffer_target(0) == 1
    assert FedAvg(Rule()).buffer_target(4) == 4


@pytest.mark.parametrize("momentum", [-0.1, 1.0, float("nan")])
def test_a_rule_refuses_momentum_outside_zero_to_one(momentum: float) -> None:
    with pytest.raises(ValueError, match="server_momentum"):
        Rule(server_momentum=momentum)


def test_a_strategy_reads_its_options_from_the_settings_and_nothing_else() -> None:
    class Settings:
        trim_fraction = 0.3
        unrelated = "ignored"

    trimmed = strategy_from_settings("trimmed_mean", Rule(), Settings())
    median = strategy_from_settings("median", Rule(buffer_size=2), Settings())

    assert isinstance(trimmed, TrimmedMean)
    assert trimmed.trim_fraction == 0.3
    assert isinstance(median, Median)
    assert median.rule.buffer_size == 2
