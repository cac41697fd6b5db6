"""When a participant's progress is due to leave: after so many episodes, or so many env steps.

Why env steps as well as episodes: an interval in episodes stretches as the
agent gets better. On CartPole an episode of a good policy lasts 500 steps,
so "every 2 episodes" means every ~1,000 env steps (and, in a group of four
learning from everyone's data, ~1,700 gradient updates) between syncs just
when the last stretch to a stable policy is made; the members' models then
drift apart between averagings and the late data of the others arrives
late. An env-step bound keeps the sync frequent whatever the episode length.
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
