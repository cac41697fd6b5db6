"""Settings for games: what `--env ALE/<Game>-v5` or a two-player game (`pettingzoo/...`)
changes unless the command line says otherwise.

The training defaults are tuned on CartPole (fedrl.client.training.learner),
and a Nature CNN on Atari wants others: the DQN settings of Mnih et al.
(2015) with Adam at 1e-4 (Hessel et al. 2018 use 6.25e-5 with a larger
budget), one update per 4 env steps, a replay filling half the memory
available up to 1M transitions (split among the learner ranks of
--learners, each of which keeps its own), and evaluations of whole games
that stop a greedy policy stuck without serving (Breakout) after 4,500
steps; for PPO, the Atari settings of Schulman et al. (2017, table 5) as
CleanRL runs them.
Two-player games change what a game's length asks for: a connect-four
game lasts about ten of the learner's moves, so saving every ten episodes
would write a file several times a second, and an evaluation plays 50
games against each fixed player from each seat (400 games: a 95 % win rate
is then known within ±2 points). DQN discounts a move by 0.9 rather than
0.99: with 0.99 a win now is worth barely more than the same win a few
moves later, and a learner that plays itself learns neither to take wins
at once nor to block them (docs/games.md, learning); and it learns at
3e-4 rather than 1e-3, at which a connect-four learner's play swung from
one evaluation to the next. It also makes one
update per four env steps rather than two: a board's moves cost the actors
little, the learner's updates are what limits a game's speed, and fresher
games per update learned faster per update and per second.
An option given on the command line always wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Set
from typing import Any

from fedrl.client.commands.config import TrainConfig
from fedrl.client.training.memory import RAM_SHARE, fitting_capacity
from fedrl.envs.atari import FRAME_SIZE, FRAME_STACK, is_atari
from fedrl.envs.board_games import is_two_player

GAME_ENGINE: dict[str, Any] = {
    "replay_ratio": 0.25,
    "eval_interval": 25_000,
    "eval_episodes": 8,
    "eval_max_steps": 4_500,
}
"""EngineConfig fields for DQN on games."""
GAME_LEARNER: dict[str, Any] = {
    "lr": 1e-4,
    "batch_size": 32,
    "target_update_interval": 1_000,
    "learning_starts": 10_000,
    "beta_anneal_updates": 100_000,
}
"""LearnerConfig fields for DQN on games (the replay capacity comes from the memory)."""
GAME_EXCHANGE: dict[str, Any] = {
    "push_transitions": 1_024,
    "pull_transitions": 1_024,
}
"""ExchangeConfig fields for DQN on games: a batch of 1,024 stacks is 58 MB of raw
columns, under the server's 64 MiB limit per experience batch; the CartPole-sized
default of 4,096 would be refused."""
GAME_PPO_ENGINE: dict[str, Any] = {
    "envs_per_worker": 8,
    "eval_interval": 25_000,
    "eval_episodes": 8,
    "eval_max_steps": 4_500,
}
GAME_PPO: dict[str, Any] = {
    "rollout_steps": 128,
    "epochs": 4,
    "minibatch_size": 256,
    "ppo_lr": 2.5e-4,
    "ppo_gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_range": 0.1,
    "entropy_coef": 0.01,
}
"""PPOConfig fields for games."""
TWO_PLAYER_ENGINE: dict[str, Any] = {
    "replay_ratio": 0.25,
    "eval_interval": 20_000,
    "eval_episodes": 50,
}
"""EngineConfig fields for two-player games (eval_episodes: games per fixed player and seat;
the replay ratio is DQN's, PPO does not read it)."""
TWO_PLAYER_RUN: dict[str, Any] = {
    "save_model_every": 1_000,
    "save_progress_every": 10_000,
}
"""TrainConfig fields for two-player games: saves counted in (short) games."""
TWO_PLAYER_LEARNER: dict[str, Any] = {"gamma": 0.9, "lr": 3e-4}
"""LearnerConfig fields for DQN on two-player games."""


def with_game_defaults(
    config: TrainConfig, given: Set[str], *, replays: int = 1
) -> tuple[TrainConfig, dict[str, Any]]:
    """The config with the game settings for every option not in `given`, and those settings.

    DQN's replay capacity takes a `replays`-th of the memory a lone replay
    would (one replay per learner rank on this machine). Other envs get the
    config as it is and no settings.
    """
    if replays < 1:
        raise ValueError(f"replays must be at least 1, got {replays}")
    if is_two_player(config.engine.env):
        engine = {k: v for k, v in TWO_PLAYER_ENGINE.items() if k not in given}
        run = {k: v for k, v in TWO_PLAYER_RUN.items() if k not in given}
        dqn = TWO_PLAYER_LEARNER if config.algo == "dqn" else {}
        learner = {k: v for k, v in dqn.items() if k not in given}
        changed = dataclasses.replace(
            config,
            engine=dataclasses.replace(config.engine, **engine),
            learner=dataclasses.replace(config.learner, **learner),
            **run,
        )
        return changed, engine | learner | run
    if not is_atari(config.engine.env):
        return config, {}
    if config.algo == "ppo":
        engine, learner, ppo, exchange = dict(GAME_PPO_ENGINE), {}, dict(GAME_PPO), {}
    else:
        obs_shape = (FRAME_STACK, FRAME_SIZE, FRAME_SIZE)
        engine, ppo, exchange = dict(GAME_ENGINE), {}, dict(GAME_EXCHANGE)
        capacity = fitting_capacity(obs_shape, share=RAM_SHARE / replays)
        learner = GAME_LEARNER | {"replay_capacity": capacity}
    engine, learner, ppo, exchange = (
        {k: v for k, v in d.items() if k not in given} for d in (engine, learner, ppo, exchange)
    )
    changed = dataclasses.replace(
        config,
        engine=dataclasses.replace(config.engine, **engine),
        learner=dataclasses.replace(config.learner, **learner),
        ppo=dataclasses.replace(config.ppo, **ppo),
        exchange=dataclasses.replace(config.exchange, **exchange),
    )
    return changed, engine | learner | ppo | exchange


def describe(settings: dict[str, Any]) -> str:
    """The settings as the options that would give them, e.g. "--lr 0.0001 --batch-size 32"."""
    return " ".join(f"--{name.replace('_', '-')} {value}" for name, value in settings.items())
