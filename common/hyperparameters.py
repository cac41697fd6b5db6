"""The hyperparameters population-based training searches: names, ranges, and how they move.

Shared by the server, which explores them (fedrl.server.population.exploit_explore), and
the participant, which applies them (fedrl.client.training.hyperparameters).
Names are algorithm-neutral on the wire: a DQN member's "lr" is its Adam
learning rate as a PPO member's is; each algorithm searches four of them.

Exploring a member's hyperparameters (Jaderberg et al. 2017, "Population
based training of neural networks", §4: "perturb" and "resample"): each one
independently is, with probability `resample_probability` (the server's
--pbt-resample-probability, 0.25 by default), drawn afresh from its range;
otherwise it is multiplied by 0.8 or by 1.2, each as likely, and clipped to
its range. A discount moves through its horizon 1 / (1 − γ) instead, which
×0.8 and ×1.2 cannot push past 1; an interval stays a whole number. A value
of 0 (PPO's default entropy coefficient) is moved only by resampling.
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
        """`value` scaled by `factor` (its horizon, for a discount), within the range."""
        if self.scale == "horizon":
            return self._fit(1.0 - (1.0 - value) / factor)
        return self._fit(value * factor)

    def resample(self, rng: random.Random) -> float:
        """A fresh draw: log-uniform, uniform, or log-uniform in the horizon."""
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
    "gamma": SearchRange(0.9, 0.999, "horizon", doc="discount (--gamma, --ppo-gamma)"),
    "exploration_base": SearchRange(
        0.05, 0.9, "linear", doc="DQN: Ape-X ε base (--exploration-base)"
    ),
    "target_update_interval": SearchRange(
        50, 5_000, "log", integer=True, doc="DQN: updates between target updates"
    ),
    "clip_range": SearchRange(0.05, 0.5, "linear", doc="PPO: clip ε (--clip-range)"),
    "entropy_coef": SearchRange(0.0, 0.05, "linear", doc="PPO: entropy bonus (--entropy-coef)"),
}
"""Every hyperparameter a member may report, with the range explore keeps it in."""

SEARCHED: Mapping[str, tuple[str, ...]] = {
    "dqn": ("lr", "gamma", "exploration_base", "target_update_interval"),
    "ppo": ("lr", "gamma", "clip_range", "entropy_coef"),
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
