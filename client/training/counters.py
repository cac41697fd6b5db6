"""What the training engine reports: where training stands, and what one round did."""

from __future__ import annotations

from dataclasses import dataclass

from fedrl.client.training.evaluation import EvalResult


@dataclass(frozen=True)
class Counters:
    """Where training stands; what autosave persists and what resume restores."""

    episodes: int = 0
    env_steps: int = 0
    updates: int = 0
    best_eval: float | None = None
    last_eval: float | None = None
    recent_returns: tuple[float, ...] = ()


@dataclass(frozen=True)
class PollResult:
    """What one round did."""

    episode_returns: tuple[float, ...]
    episode_lengths: tuple[int, ...]
    env_steps: int
    updates: int
    train_metrics: dict[str, float]
    evaluation: EvalResult | None
    new_best: bool
    policy_updates: int = 0
    """PPO: rollouts learned from in this round (the sync loop pushes after each); DQN: 0."""
