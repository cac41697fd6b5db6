"""When a participant's progress is due to leave: after so many episodes, or so many env steps.

Why env steps as well as episodes: an interval in episodes stretches with
the episodes. A trading env that walks a year of bars, or a good CartPole
policy's 500 steps, would otherwise leave thousands of env steps between
syncs, and the others' data and progress would arrive that much later. An
env-step bound keeps syncs coming whatever the episode length. In
synchronous rounds (--round-wait-s) it is all there is: every 128 env
steps unless given. Asynchronously it is off by default (--sync-steps 0):
there a step bound on top of the episodes did not make groups faster
(docs/benchmarks.md, federation).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SyncInterval:
    """Push (and queue experience) once `episodes` episodes or `env_steps` env steps have passed.

    `env_steps` 0 leaves episodes alone to decide. `episodes` 0 leaves env
    steps alone, and then a sync falls due each time the env-step counter
    passes a multiple of `env_steps` (synchronous rounds). Why multiples: a
    round of the engine takes in a few env steps fewer than its envs took
    (those still waiting on their n-step return), so "this many since the
    last push" would sync every other round, twice the steps apart; a
    multiple of the count is passed in nearly every round, at the same
    counts for every member of a group.
    """

    episodes: int = 2
    env_steps: int = 0

    def __post_init__(self) -> None:
        if self.env_steps < 0:
            raise ValueError(f"sync steps must be >= 0 (0: episodes only), got {self.env_steps}")
        if self.episodes < 0 or (self.episodes == 0 and self.env_steps == 0):
            raise ValueError(
                "sync interval must be at least one episode (0 only with sync steps), "
                f"got {self.episodes}"
            )

    def due(self, *, episodes: int, env_steps: int, total_env_steps: int) -> bool:
        """Whether progress made over `episodes` episodes and `env_steps` env steps should go,
        the env-step counter now at `total_env_steps`."""
        if self.episodes == 0:
            pushed_at = total_env_steps - env_steps
            return env_steps > 0 and total_env_steps // self.env_steps > pushed_at // self.env_steps
        return 0 < self.episodes <= episodes or 0 < self.env_steps <= env_steps
