"""The default guard against finite-but-huge updates: a norm bound relative to the session.

An update's L2 norm (over all its tensors) is refused when it exceeds
`factor` times a reference:

- the median norm of the session's last WINDOW accepted updates, once at
  least WARMUP of them are known (kept across restarts: each accepted
  update's norm is in its ack row, and recovery reads them back), but never
  less than MODEL_FLOOR of the global model's own norm, so an update as
  large as the model itself is never refused for being larger than the
  recent ones. Update sizes in RL change by orders of magnitude between
  phases of training: seen, 0.23 refused against a median of 1.4e-7 (a
  learner that trained little before it left, then a new one), and a
  learner's first syncs after its replay filled (norms 3-6 against a model
  of norm 14) refused against the tiny updates from before it learned;
- before that, the norm of the global model itself: one sync cannot
  honestly move a model by several times its own size;
- no reference yet (a model of zeros and no accepted update): no bound.

The default factor is 20: honest syncs of DQN groups on CartPole move the
model by at most about 8 times the recent median (a long sync interval with
K=1), so 20 leaves a margin over honest jumps (docs/security.md), while
one participant's 3e38 delta, or any delta hundreds of times the others', is
refused with INVALID_ARGUMENT and never reaches the aggregate.
The median moves with the group's training, and one participant cannot drag
it: it would need half of the last WINDOW updates.

--max-update-norm is an absolute bound on top of this; --update-norm-factor
0 turns this one off (a group that trusts each other and wants no refusals).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence

import numpy as np

from fedrl.server.refusals import InvalidRequestError
from fedrl.server.strategy.aggregate import l2_norm

WINDOW = 32
"""Accepted updates whose norms the median is taken over."""
WARMUP = 4
"""Accepted updates needed before their median is the reference."""
MODEL_FLOOR = 0.05
"""The reference is at least this share of the global model's norm: with the default factor
of 20, an update up to the model's own norm is never refused for being larger than the recent
ones (an honest sync measured at most 0.4 of it)."""


class NormBound:
    """One session's bound; check() before an update is logged, accepted() once it is."""

    def __init__(self, *, factor: float) -> None:
        self._factor = factor
        self._recent: deque[float] = deque(maxlen=WINDOW)
        self._model: tuple[int, float] = (-1, 0.0)
        """(version, norm) of the global model last used as the reference."""

    def check(self, norm: float, *, version: int, model: Sequence[np.ndarray]) -> None:
        """Raise InvalidRequestError if `norm` is above the bound; `model` is global `version`."""
        if self._factor <= 0:
            return
        if self._model[0] != version:
            self._model = (version, l2_norm(model))
        model_norm = self._model[1]
        median = statistics.median(self._recent) if len(self._recent) >= WARMUP else 0.0
        if len(self._recent) >= WARMUP and median >= MODEL_FLOOR * model_norm:
            reference = median
            basis = f"the median norm {reference:.4g} of the session's last {len(self._recent)} "
            basis += "accepted updates"
        elif len(self._recent) >= WARMUP:
            reference = MODEL_FLOOR * model_norm
            basis = f"{MODEL_FLOOR:g} x the norm {model_norm:.4g} of global version {version}"
        else:
            reference = model_norm
            basis = f"the norm {reference:.4g} of global version {version}"
        if reference <= 0:
            return
        if norm > self._factor * reference:
            raise InvalidRequestError(
                f"update norm {norm:.4g} exceeds {self._factor:g} x {basis} "
                "(--update-norm-factor); check the learning rate, or sync more often"
            )

    def accepted(self, norm: float) -> None:
        """Count the norm of an update that was acknowledged."""
        self._recent.append(norm)

    @property
    def window(self) -> int:
        """How many of the newest accepted norms the bound looks at."""
        return WINDOW
