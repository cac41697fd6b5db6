"""Capped exponential backoff with full jitter, for retrying an unreachable server.

The delay before retry n (counting from 0) is uniform in [0, min(cap, base·factor^n)]
("full jitter", Brooker, AWS Architecture Blog 2015): after a server restart,
every participant's retries spread over the whole window instead of arriving
together in waves, and the cap keeps a long outage from pushing the next try
hours away. The random source is injected so the schedule is testable
without sleeping.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    """How long to wait between attempts to reach the server."""

    base_s: float = 0.5
    """Upper bound of the first delay: a blip (server restart, Wi-Fi handover) heals fast."""
    factor: float = 2.0
    """Growth of the bound per consecutive failure."""
    cap_s: float = 30.0
    """Largest bound: during a long outage a participant still retries twice a minute."""

    def __post_init__(self) -> None:
        if not (self.base_s > 0 and math.isfinite(self.base_s)):
            raise ValueError(
                f"backoff base must be a positive number of seconds, got {self.base_s}"
            )
        if not self.factor >= 1:
            raise ValueError(f"backoff factor must be at least 1, got {self.factor}")
        if not self.cap_s >= self.base_s:
            raise ValueError(
                f"backoff cap ({self.cap_s} s) must be at least its base ({self.base_s} s)"
            )

    def bound(self, failures: int) -> float:
        """The largest delay after `failures` consecutive failures (1 or more)."""
        if failures < 1:
            raise ValueError(f"a delay follows at least one failure, got {failures}")
        # Compare exponents rather than computing factor**n, which overflows
        # a float after about a thousand failures of a week-long outage.
        if self.factor > 1 and failures - 1 >= math.log(self.cap_s / self.base_s, self.factor):
            return self.cap_s
        return min(self.cap_s, self.base_s * self.factor ** (failures - 1))

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """A full-jitter delay after `failures` failures in a row; rand() is uniform in [0, 1)."""
        return rand() * self.bound(failures)


class Backoff:
    """The retry state of one connection: consecutive failures and the next delay."""

    def __init__(
        self,
        policy: BackoffPolicy = BackoffPolicy(),
        *,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._policy = policy
        self._rand = rand
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last success."""
        return self._failures

    def failed(self) -> float:
        """Record a failed attempt; returns how long to wait before the next one."""
        self._failures += 1
        return self._policy.delay(self._failures, self._rand)

    def succeeded(self) -> None:
        """Record a success: the next failure starts the schedule over."""
        self._failures = 0
