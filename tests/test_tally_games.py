"""The tally holds two-player games for the league, and nothing for envs that are no game."""

from __future__ import annotations

import numpy as np

from fedrl.client.training.counters import Tally
from fedrl.envs.two_player import NO_OPPONENT


def test_episodes_of_an_env_that_is_no_game_are_not_held_as_games() -> None:
    tally = Tally(recent_window=10)

    for _ in range(100):
        tally.count(
            32,
            np.ones(4, dtype=np.float64),
            np.full(4, 8, dtype=np.int64),
            np.full(4, NO_OPPONENT, dtype=np.int64),
        )

    opponents, outcomes = tally.take_games()
    assert len(opponents) == len(outcomes) == 0
    assert tally.episodes == 400


def test_only_the_games_against_an_opponent_reach_the_league() -> None:
    tally = Tally(recent_window=10)

    tally.count(
        16,
        np.array([1.0, -1.0, 0.0], dtype=np.float64),
        np.array([5, 6, 7], dtype=np.int64),
        np.array([3, NO_OPPONENT, 0], dtype=np.int64),
    )

    opponents, outcomes = tally.take_games()
    assert opponents.tolist() == [3, 0]
    assert outcomes.tolist() == [1.0, 0.0]
    assert len(tally.take_games()[0]) == 0
