"""The training engine's configuration: collection, replay ratio, evaluation, seeds, opponents.

One frozen dataclass whose fields are the `fedrl-client` options of the
engine (fedrl.common.config_cli), and the default worker count it derives
from this machine's cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fedrl.client.training.self_play_config import SelfPlayConfig
from fedrl.common.config_cli import doc, section


def available_cores() -> int:
    """Cores this process may run on (affinity-aware, unlike os.cpu_count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_workers() -> int:
    """One core stays with the learner; the rest act. One core means serial mode (0)."""
    return max(0, available_cores() - 1)


@dataclass(frozen=True)
class EngineConfig:
    """Collection, replay-ratio and evaluation knobs of the engine (the replay ones: DQN only)."""

    env: str = field(default="CartPole-v1", metadata=doc("Gymnasium environment id."))
    data: str | None = field(
        default=None,
        metadata=doc(
            "What the environment reads: for fedrl/Trading-v0 a CSV, Parquet or Arrow file "
            "of OHLCV bars, or a PostgreSQL URL (postgresql://user@host/db)."
        ),
    )
    workers: int = field(
        default_factory=default_workers,
        metadata=doc(
            "Actor processes; 0 runs the actor in the learner's process. Default: cores − 1."
        ),
    )
    envs_per_worker: int = field(default=16, metadata=doc("Envs each actor steps as one batch."))
    n_step: int = field(
        default=3, metadata=doc("Rewards summed into each transition before bootstrapping.")
    )
    exploration_base: float = field(
        default=0.4, metadata=doc("Ape-X ε_i = base^(1 + alpha·i/(N−1)) over all N envs.")
    )
    exploration_alpha: float = field(
        default=7.0, metadata=doc("Ape-X exponent spread: the greediest env gets base^(1 + alpha).")
    )
    replay_ratio: float = field(
        default=0.5,
        metadata=doc(
            "Gradient updates per env step (Fedus et al. 2020); SB3's CartPole zoo setting is 0.5."
        ),
    )
    steps_per_slot: int = field(
        default=8,
        metadata=doc("Vector steps an actor collects before handing its slot to the learner."),
    )
    slots_per_worker: int = field(
        default=4,
        metadata=doc(
            "Shared-memory slots per actor: how far collection may run ahead of the learner."
        ),
    )
    weights_interval: int = field(
        default=16, metadata=doc("Updates between publishing the learner's weights to the actors.")
    )
    eval_interval: int = field(
        default=5_000, metadata=doc("Env steps between greedy evaluations; 0 disables evaluation.")
    )
    eval_episodes: int = field(
        default=10, metadata=doc("Episodes per evaluation, played at once on envs of their own.")
    )
    eval_max_steps: int = field(
        default=100_000, metadata=doc("Step cap per evaluation, for envs without a time limit.")
    )
    max_actor_restarts: int = field(
        default=3, metadata=doc("Restarts of dead actors before the run stops with an error.")
    )
    learner_threads: int = field(
        default=1,
        metadata=doc("torch intra-op threads of the learner's process; actors use one each."),
    )
    seed: int = field(
        default=0,
        metadata=doc("Root of every seed stream: actors, envs, evaluation and the learner."),
    )
    clip_rewards: bool = field(
        default=True,
        metadata=doc("Atari games: train on the sign of each reward; scores stay raw."),
    )
    episodic_life: bool = field(
        default=True,
        metadata=doc(
            "Atari games, DQN: a lost life cuts the n-step return as an episode's end would; "
            "the game, its frames and its score go on."
        ),
    )
    self_play: SelfPlayConfig = field(
        default_factory=SelfPlayConfig,
        metadata=section("Two-player games: the opponent pool and how opponents are drawn."),
    )

    def __post_init__(self) -> None:
        at_least = {
            "workers": (self.workers, 0),
            "envs_per_worker": (self.envs_per_worker, 1),
            "n_step": (self.n_step, 1),
            "steps_per_slot": (self.steps_per_slot, 1),
            "slots_per_worker": (self.slots_per_worker, 1),
            "weights_interval": (self.weights_interval, 1),
            "eval_interval": (self.eval_interval, 0),
            "eval_episodes": (self.eval_episodes, 1),
            "eval_max_steps": (self.eval_max_steps, 1),
            "max_actor_restarts": (self.max_actor_restarts, 0),
            "learner_threads": (self.learner_threads, 1),
        }
        for name, (value, low) in at_least.items():
            if value < low:
                raise ValueError(f"{name} must be at least {low}, got {value}")
        if not self.replay_ratio > 0:
            raise ValueError(f"replay_ratio must be > 0, got {self.replay_ratio}")
