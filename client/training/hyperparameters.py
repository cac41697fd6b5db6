"""A running engine's searchable hyperparameters by their wire names, read from and into configs.

The names are fedrl.common.hyperparameters': "lr" is LearnerConfig.lr for a
DQN and PPOConfig.ppo_lr for PPO, and so on. Reading and replacing go
through the frozen configs, so the engine and learner keep one source of
truth for every knob.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.ppo_learner import PPOConfig

Hyperparameters = Mapping[str, float]

# (config, field) of each searched name: "engine" is EngineConfig, "learner" the learner's.
_DQN_FIELDS = {
    "lr": ("learner", "lr"),
    "replay_ratio": ("engine", "replay_ratio"),
    "n_step": ("engine", "n_step"),
    "target_update_interval": ("learner", "target_update_interval"),
    "gamma": ("learner", "gamma"),
    "exploration_base": ("engine", "exploration_base"),
}
_PPO_FIELDS = {
    "lr": ("learner", "ppo_lr"),
    "entropy_coef": ("learner", "entropy_coef"),
    "clip_range": ("learner", "clip_range"),
    "gae_lambda": ("learner", "gae_lambda"),
}

_WHOLE = frozenset({"n_step", "target_update_interval"})
"""Fields that are ints in their configs."""

_ACTOR_FIELDS = frozenset({"gamma", "exploration_base", "n_step"})
"""DQN hyperparameters its actors hold from their start: the n-step return's length and γ,
and the ε ladder."""


def _fields(learner: LearnerConfig | PPOConfig) -> Mapping[str, tuple[str, str]]:
    return _PPO_FIELDS if isinstance(learner, PPOConfig) else _DQN_FIELDS


def read_hyperparameters(
    engine: EngineConfig, learner: LearnerConfig | PPOConfig
) -> dict[str, float]:
    """The searched hyperparameters of these configs."""
    configs: dict[str, object] = {"engine": engine, "learner": learner}
    return {
        name: float(getattr(configs[where], field))
        for name, (where, field) in _fields(learner).items()
    }


def with_hyperparameters(
    engine: EngineConfig, learner: LearnerConfig | PPOConfig, values: Hyperparameters
) -> tuple[EngineConfig, LearnerConfig | PPOConfig]:
    """Copies of the configs with `values` in place; ValueError for a name this algorithm lacks."""
    fields = _fields(learner)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        algorithm = "PPO" if isinstance(learner, PPOConfig) else "DQN"
        raise ValueError(f"{algorithm} has no hyperparameter {unknown}; it searches {list(fields)}")
    changes: dict[str, dict[str, Any]] = {"engine": {}, "learner": {}}
    for name, value in values.items():
        where, field = fields[name]
        changes[where][field] = round(value) if field in _WHOLE else float(value)
    return (
        dataclasses.replace(engine, **changes["engine"]),
        dataclasses.replace(learner, **changes["learner"]),
    )


def actors_need_restart(
    engine_before: EngineConfig,
    learner_before: LearnerConfig | PPOConfig,
    engine_after: EngineConfig,
    learner_after: LearnerConfig | PPOConfig,
) -> bool:
    """Whether DQN actors hold a hyperparameter that changed (PPO's actors hold none)."""
    if isinstance(learner_before, PPOConfig):
        return False
    before = read_hyperparameters(engine_before, learner_before)
    after = read_hyperparameters(engine_after, learner_after)
    return any(before[name] != after[name] for name in _ACTOR_FIELDS)
