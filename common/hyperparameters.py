"""The hyperparameters population-based training searches: names, ranges, and how they move.

Shared by the server, which explores them (fedrl.server.population.exploit_explore), and
the participant, which applies them (fedrl.client.training.hyperparameters).
Names are algorithm-neutral on the wire: a DQN member's "lr" is its Adam
learning rate as a PPO member's is. DQN searches six (learning rate, replay
ratio, n-step, target period, discount, exploration base), PPO four
(learning rate, entropy coefficient, clip range, GAE λ).

Exploring a member's hyperparameters (Jaderberg et al. 2017, "Population
based training of neural networks", §4: "perturb" and "resample"): each one
independently is, with probability `resample_probability` (the server's
--pbt-resample-probability, 0.25 by default), drawn afresh from its range;
otherwise it is multiplied by 0.8 or by 1.2, each as likely, and clipped to
its range. A discount (γ, GAE's λ) moves through its horizon 1 / (1 − γ)
instead, which ×0.8 and ×1.2 cannot push past 1. A whole number stays whole
and moves by at least one where its range allows (n-step 1 → 2, not 1.2 → 1).
A value of 0 (PPO's default entropy coefficient) is moved only by resampling.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

PERTURB_FACTORS = (0.8, 1.2)
"""Explore's multiplicative steps (the PBT paper's)."""

Scale = Literal["log", "linear", "horizon"]


@dataclass(frozen=True)
class SearchRange:
    """One hyperparameter's range and the scale it is drawn and perturbed on."""

    low: float
    high: float
    scale: Scale
    integer: bool = False
    doc: str = ""

    def contains(self, value: float) -> bool:
        return math.isfinite(value) and self.low <= value <= self.high

    def perturb(self, value: float, factor: float) -> float:
        """`value` scaled by `factor` (its horizon, for a discount), within the range; a whole
        number moves at least one step the factor's way, unless that leaves the range."""
        if self.scale == "horizon":
            return self._fit(1.0 - (1.0 - value) / factor)
        moved = self._fit(value * factor)
        if self.integer and moved == value:
            return self._fit(value + (1 if factor > 1 else -1))
        return moved

    def resample(self, rng: random.Random) -> float:
        """A fresh draw: log-uniform, uniform (each whole number as likely), or log-uniform in
        the horizon."""
        if self.scale == "linear" and self.integer:
            return float(rng.randint(int(self.low), int(self.high)))
        if self.scale == "log":
            drawn = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        elif self.scale == "horizon":
            horizon = math.exp(rng.uniform(-math.log(1 - self.low), -math.log(1 - self.high)))
            drawn = 1.0 - 1.0 / horizon
        else:
            drawn = rng.uniform(self.low, self.high)
        return self._fit(drawn)

    def _fit(self, value: float) -> float:
        clipped = min(self.high, max(self.low, value))
        return float(round(clipped)) if self.integer else clipped


SEARCH_SPACE: Mapping[str, SearchRange] = {
    "lr": SearchRange(1e-5, 1e-2, "log", doc="Adam learning rate (--lr, --ppo-lr)"),
    "replay_ratio": SearchRange(
        1 / 16, 2.0, "log", doc="DQN: updates per env step (--replay-ratio)"
    ),
    "n_step": SearchRange(
        1, 10, "linear", integer=True, doc="DQN: rewards summed per transition (--n-step)"
    ),
    "target_update_interval": SearchRange(
        50, 5_000, "log", integer=True, doc="DQN: updates between target updates"
    ),
    "gamma": SearchRange(0.9, 0.999, "horizon", doc="DQN: discount (--gamma)"),
    "exploration_base": SearchRange(
        0.05, 0.9, "linear", doc="DQN: Ape-X ε base (--exploration-base)"
    ),
    "entropy_coef": SearchRange(0.0, 0.05, "linear", doc="PPO: entropy bonus (--entropy-coef)"),
    "clip_range": SearchRange(0.05, 0.5, "linear", doc="PPO: clip ε (--clip-range)"),
    "gae_lambda": SearchRange(0.8, 0.999, "horizon", doc="PPO: GAE's λ (--gae-lambda)"),
}
"""Every hyperparameter a member may report, with the range explore keeps it in."""

SEARCHED: Mapping[str, tuple[str, ...]] = {
    "dqn": (
        "lr",
        "replay_ratio",
        "n_step",
        "target_update_interval",
        "gamma",
        "exploration_base",
    ),
    "ppo": ("lr", "entropy_coef", "clip_range", "gae_lambda"),
}
"""The hyperparameters a population searches, by algorithm."""


def check_hyperparameters(values: Mapping[str, float]) -> dict[str, float]:
    """The values as a plain dict; ValueError naming an unknown name or an out-of-range value."""
    if not values:
        raise ValueError("a population member reports its hyperparameters; none were given")
    checked: dict[str, float] = {}
    for name, value in values.items():
        space = SEARCH_SPACE.get(name)
        if space is None:
            raise ValueError(
                f"unknown hyperparameter {name!r}; population-based training searches "
                f"{', '.join(SEARCH_SPACE)}"
            )
        if not space.contains(value):
            raise ValueError(
                f"hyperparameter {name} = {value} lies outside its search range "
                f"[{space.low:g}, {space.high:g}]"
            )
        if space.integer and value != round(value):
            raise ValueError(f"hyperparameter {name} = {value} must be a whole number")
        checked[name] = float(value)
    return checked


def explore(
    values: Mapping[str, float], rng: random.Random, *, resample_probability: float
) -> dict[str, float]:
    """New values for every hyperparameter, each resampled or perturbed (module docstring)."""
    explored: dict[str, float] = {}
    for name in sorted(values):
        space = SEARCH_SPACE[name]
        if rng.random() < resample_probability:
            explored[name] = space.resample(rng)
        else:
            explored[name] = space.perturb(values[name], rng.choice(PERTURB_FACTORS))
    return explored
