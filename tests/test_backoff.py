"""Capped exponential backoff with full jitter, driven by an injected random source and clock."""

from __future__ import annotations

import pytest

from fedrl.client.federation.backoff import Backoff, BackoffPolicy


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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


def test_backoff_is_not_ready_until_its_delay_has_passed() -> None:
    clock = FakeClock()
    backoff = Backoff(BackoffPolicy(base_s=2.0, cap_s=60.0), rand=lambda: 0.5, clock=clock)

    delay = backoff.failed()

    assert delay == pytest.approx(1.0)
    assert not backoff.ready()
    assert backoff.remaining() == pytest.approx(1.0)
    clock.now += 1.0
    assert backoff.ready()


def test_consecutive_failures_grow_the_delay_and_success_resets_it() -> None:
    clock = FakeClock()
    backoff = Backoff(
        BackoffPolicy(base_s=1.0, factor=2.0, cap_s=60.0), rand=lambda: 1.0, clock=clock
    )

    delays = [backoff.failed() for _ in range(4)]
    backoff.succeeded()

    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert backoff.failures == 0
    assert backoff.ready()
    assert backoff.failed() == 1.0


def test_fresh_backoff_is_ready_at_once() -> None:
    backoff = Backoff(clock=FakeClock())

    assert backoff.ready()
    assert backoff.remaining() == 0.0
