"""Elo ratings of two-player games: the expected score and the update after one game.

Elo rather than TrueSkill or OpenSkill: the games have two players and an
outcome of win, draw or loss, for which Elo's logistic model is the standard
of self-play work (AlphaZero, AlphaStar report Elo); the expected score it
gives is the win probability that prioritised fictitious self-play weighs
opponents by; and one anchored scale (the uniform random player at 0,
fedrl.client.training.league) lets the server average the ratings that
several participants give one global version. A rating's uncertainty, what
the Bayesian systems add, matters little when every pairing is played
thousands of times.
"""

from __future__ import annotations

SCALE = 400.0
"""A rating difference of 400 makes the stronger player's expected score 10/11."""
K_FACTOR = 16.0
"""Points a rating moves per game at most: FIDE's for established players is 10-20."""


def expected_score(rating: float, opponent: float) -> float:
    """The score (1 win, ½ draw, 0 loss) a player of `rating` expects against `opponent`."""
    return float(1.0 / (1.0 + 10.0 ** ((opponent - rating) / SCALE)))


def updated(rating: float, opponent: float, score: float, *, k: float = K_FACTOR) -> float:
    """`rating` after one game against `opponent` that scored `score` (1, ½ or 0)."""
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"a game's score lies in [0, 1], got {score}")
    return rating + k * (score - expected_score(rating, opponent))


def score_of(outcome: float) -> float:
    """A game's score from the learner's outcome (its return): 1 a win, ½ a draw, 0 a loss."""
    if outcome > 0:
        return 1.0
    return 0.5 if outcome == 0 else 0.0
