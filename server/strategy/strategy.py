"""Strategy: the whole aggregation rule of one session, in one object.

From the moment an update arrives to the moment it is part of a global
version, every decision is the strategy's:

- admission: how stale an update may be (max_staleness) and how large
  (an absolute bound, max_update_norm, and one relative to the session's
  recent updates, norm_bound.py);
- weighting: what an update counts for, min(samples, cap) x (1 + s)^-a
  (FedBuff, Nguyen et al. 2022);
- clipping: each update scaled to at most clip_norm before it is combined;
- reduction: how the buffer's deltas combine into one, the part each
  strategy's own file defines (`aggregate`: the weighted mean of fedavg.py,
  trimmed_mean.py, median.py);
- the server step: global += server_lr x velocity, where velocity =
  server_momentum x velocity + aggregate (FedAvgM, Hsu et al. 2019; with
  momentum 0 the velocity is the aggregate and nothing is carried);
- the buffer: K updates make a version (buffer_size; 0: one per participant
  who pushed within active_window_s), or whatever is buffered after
  buffer_timeout_s.

The math is aggregate.py's pure functions. The state a strategy carries
survives a restart as every other server state does: the velocity is
written with each version before its row commits (the aggregator), and the
norms of accepted updates are in their ack rows, read back at recovery
(`restore_norms`).

A new strategy is one file with a subclass that names itself and defines
`aggregate`, plus its line in registry.py; settings of its own are
constructor keywords listed in `options`, each a ServerConfig field of the
same name.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedrl.server.refusals import InvalidRequestError, PreconditionError
from fedrl.server.strategy.aggregate import clip_by_norm, server_step, update_weight
from fedrl.server.strategy.norm_bound import NormBound


@dataclass(frozen=True)
class Rule:
    """The settings every strategy applies the same way (the module docstring's list)."""

    max_staleness: int = 16
    """Oldest accepted base version, in versions behind the newest; older is refused."""
    max_samples: int = 100_000
    """Cap on the sample count an update may claim for its weight."""
    staleness_exponent: float = 0.5
    """An update s versions stale weighs (1 + s) ** -exponent times its samples."""
    max_update_norm: float = 0.0
    """Refuse an update whose L2 norm exceeds this (0: no absolute bound)."""
    update_norm_factor: float = 20.0
    """Refuse an update this many times the session's recent norms (norm_bound.py; 0: off)."""
    clip_norm: float = 0.0
    """Clip each update's L2 norm to this before it is combined (0: no clipping)."""
    server_lr: float = 1.0
    """global += server_lr * velocity."""
    server_momentum: float = 0.0
    """velocity = server_momentum * velocity + aggregate (0: the aggregate itself)."""
    buffer_size: int = 0
    """Updates (K) that make a version; 0: one per participant who pushed lately."""
    buffer_timeout_s: float = 5.0
    """A non-empty buffer becomes a version after this long even below K."""
    active_window_s: float = 60.0
    """With buffer_size 0: how recent a participant's last push must be to count toward K."""

    def __post_init__(self) -> None:
        """Refuse a rule that cannot work, naming the setting."""
        if self.buffer_size < 0:
            raise ValueError(f"buffer_size must be >= 0 (0: automatic), got {self.buffer_size}")
        if not self.active_window_s > 0:
            raise ValueError(f"active_window_s must be positive, got {self.active_window_s}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if not self.buffer_timeout_s > 0:
            raise ValueError(f"buffer_timeout_s must be positive, got {self.buffer_timeout_s}")
        if self.max_samples <= 0:
            raise ValueError(f"max_samples must be positive, got {self.max_samples}")
        if self.clip_norm < 0 or self.server_lr <= 0 or self.staleness_exponent < 0:
            raise ValueError("clip_norm and staleness_exponent must be >= 0, server_lr > 0")
        if not 0 <= self.server_momentum < 1:
            raise ValueError(f"server_momentum must lie in [0, 1), got {self.server_momentum}")
        if not (math.isfinite(self.max_update_norm) and self.max_update_norm >= 0):
            raise ValueError(f"max_update_norm must be finite and >= 0, got {self.max_update_norm}")
        if not (math.isfinite(self.update_norm_factor) and self.update_norm_factor >= 0):
            raise ValueError(
                f"update_norm_factor must be finite and >= 0 (0: off), got "
                f"{self.update_norm_factor}"
            )


Tensors = list[np.ndarray]


class Strategy(ABC):
    """One session's aggregation rule; a subclass names itself and defines `aggregate`."""

    name: ClassVar[str]
    """How --strategy, --session-strategy and SessionConfig.strategy call it."""
    options: ClassVar[tuple[str, ...]] = ()
    """Its constructor keywords beyond the rule, each a ServerConfig field of that name."""

    def __init__(self, rule: Rule | None = None) -> None:
        self.rule = Rule() if rule is None else rule
        self._norms = NormBound(factor=self.rule.update_norm_factor)

    @abstractmethod
    def aggregate(
        self, deltas: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
    ) -> Tensors:
        """The reduction: one float32 tensor per model tensor; refuses mismatched or
        non-finite input with ValueError."""

    # Admission and weighting.

    def staleness(self, base_version: int, current_version: int) -> int:
        """Versions between an update's base and the newest; refused past max_staleness."""
        if not 0 <= base_version <= current_version:
            raise InvalidRequestError(
                f"base_version {base_version} does not exist; the newest is {current_version}"
            )
        staleness = current_version - base_version
        if staleness > self.rule.max_staleness:
            raise PreconditionError(
                f"update is {staleness} versions stale (base {base_version}, current version "
                f"{current_version}, max staleness {self.rule.max_staleness}); pull version "
                f"{current_version} and train from it"
            )
        return staleness

    def weight(self, samples: int, staleness: int) -> float:
        """What an update counts for in the buffer."""
        return update_weight(
            samples,
            staleness,
            max_samples=self.rule.max_samples,
            exponent=self.rule.staleness_exponent,
        )

    def check_norm(self, norm: float, *, version: int, model: Sequence[np.ndarray] | None) -> None:
        """Refuse an update whose global L2 norm is out of bounds; `model` is global `version`
        (None before the session has one: then only the absolute bound applies).

        Clipping (clip_norm) shrinks a large update and still applies it; a
        bound refuses it, for groups whose members need not trust each other.
        """
        bound = self.rule.max_update_norm
        if bound > 0 and norm > bound:
            raise InvalidRequestError(
                f"update norm {norm:.6g} exceeds this server's bound of {bound:g} "
                "(--max-update-norm); check the learning rate, or sync more often"
            )
        if model is not None:
            self._norms.check(norm, version=version, model=model)

    def accepted(self, norm: float) -> None:
        """An update of this norm was acknowledged: the relative bound counts it."""
        self._norms.accepted(norm)

    def restore_norms(self, norms: Sequence[float]) -> None:
        """At recovery: the norms of the session's last accepted updates, oldest first."""
        for norm in norms[-self._norms.window :]:
            self._norms.accepted(norm)

    @property
    def norm_window(self) -> int:
        """How many recent norms restore_norms needs."""
        return self._norms.window

    # Combination.

    def clip(self, delta: Sequence[np.ndarray]) -> Tensors:
        """The delta as float32, scaled to at most clip_norm (unchanged when 0)."""
        if self.rule.clip_norm > 0:
            clipped, _norm = clip_by_norm(list(delta), self.rule.clip_norm)
            return clipped
        return list(delta)

    def step(
        self,
        global_tensors: Sequence[np.ndarray],
        aggregate: Sequence[np.ndarray],
        velocity: Sequence[np.ndarray] | None,
    ) -> tuple[Tensors, Tensors | None]:
        """The next global model and the velocity to carry to the next version."""
        return server_step(
            global_tensors,
            aggregate,
            learning_rate=self.rule.server_lr,
            momentum=self.rule.server_momentum,
            velocity=velocity,
        )

    # The buffer.

    def buffer_target(self, pushing_participants: int) -> int:
        """K: the configured one, or the number of participants who pushed lately (at least 1).

        An automatic K follows the group: alone, every update is a version at
        once, so the global model trails the participant by one update rather
        than by K of them; in a group of N, a version waits for about one
        update from each member, so it averages everyone's progress instead of
        adding up N learners' steps, which would move the global Q-network N
        times as far as any member's did. The buffer timeout still bounds the wait.
        """
        return self.rule.buffer_size or max(1, pushing_participants)
