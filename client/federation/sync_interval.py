"""When a participant's progress is due to leave: after so many episodes, or so many env steps.

Why env steps as well as episodes: an interval in episodes stretches with
the episodes. A trading env that walks a year of bars, or a good CartPole
policy's 500 steps, would otherwise leave thousands of env steps between
syncs, and the others' data and progress would arrive that much later. An
env-step bound keeps syncs coming whatever the episode length. It is off
by default (--sync-steps 0): on CartPole groups it did not make learning
faster (bench/federation.py, fours sharing both with 256: 5,250 and 7,250
steps each to 475 in two runs of 5 seeds, no better than the defaults).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SyncInterval:
    """Push (and queue experience) once `episodes` episodes or `env_steps` env steps have passed.

    `env_steps` 0 leaves episodes alone to decide.
    """

    episodes: int = 2
    env_steps: int = 0

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"sync interval must be at least one episode, got {self.episodes}")
        if self.env_steps < 0:
            raise ValueError(f"sync steps must be >= 0 (0: episodes only), got {self.env_steps}")

    def due(self, *, episodes: int, env_steps: int) -> bool:
        """Whether progress made over `episodes` episodes and `env_steps` env steps should go."""
        return episodes >= self.episodes or 0 < self.env_steps <= env_steps
