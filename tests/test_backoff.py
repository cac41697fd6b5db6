"""Capped exponential backoff with full jitter, driven by an injected random source."""

from __future__ import annotations

import pytest

from fedrl.client.federation.backoff import Backoff, BackoffPolicy


def test_bound_doubles_from_base_until_the_cap() -> None:
    policy = BackoffPolicy(base_s=0.5, factor=2.0, cap_s=5.0)

    bounds = [policy.bound(n) for n in range(1, 7)]

    assert bounds == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_bound_stays_at_the_cap_after_very_many_failures() -> None:
    policy = BackoffPolicy(base_s=0.5, factor=2.0, cap_s=30.0)

    assert policy.bound(10_000) == 30.0


def test_delay_is_the_random_fraction_of_the_bound() -> None:
    policy = BackoffPolicy(base_s=1.0, factor=3.0, cap_s=100.0)

    assert policy.delay(3, lambda: 0.25) == pytest.approx(0.25 * 9.0)
    assert policy.delay(3, lambda: 0.0) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_s": 0.0}, "base"),
        ({"factor": 0.5}, "factor"),
        ({"base_s": 10.0, "cap_s": 1.0}, "cap"),
    ],
)
def test_bad_policy_is_refused_with_the_knob_named(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BackoffPolicy(**kwargs)


def test_consecutive_failures_grow_the_delay_and_success_resets_it() -> None:
    backoff = Backoff(BackoffPolicy(base_s=1.0, factor=2.0, cap_s=60.0), rand=lambda: 1.0)

    delays = [backoff.failed() for _ in range(4)]
    backoff.succeeded()

    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert backoff.failures == 0
    assert backoff.failed() == 1.0
