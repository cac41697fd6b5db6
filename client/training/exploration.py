"""Per-env exploration rates on the Ape-X schedule."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def apex_epsilons(count: int, *, base: float = 0.4, alpha: float = 7.0) -> npt.NDArray[np.float64]:
    """ε_i = base^(1 + alpha·i/(count−1)) for i in 0..count−1 (Horgan et al. 2018, Ape-X).

    A fixed spread of rates replaces a decaying schedule: the greedy end keeps
    the data on-policy enough to learn from, the exploring end keeps finding new
    states, and nothing has to be tuned to the run's length. One env gets
    `base` itself, the most exploring rate, so a single-env run still explores.
    """
    if count < 1:
        raise ValueError(f"need at least one env for exploration rates, got {count}")
    if not 0.0 < base < 1.0:
        raise ValueError(f"exploration base must be in (0, 1), got {base}")
    if alpha < 0.0:
        raise ValueError(f"exploration exponent must be >= 0, got {alpha}")
    if count == 1:
        return np.array([base])
    exponents = 1.0 + alpha * np.arange(count) / (count - 1)
    return np.asarray(base**exponents, dtype=np.float64)


def actor_epsilons(
    actor_index: int, num_actors: int, envs_per_actor: int, *, base: float, alpha: float
) -> npt.NDArray[np.float64]:
    """One actor's share of the schedule taken over all actors' envs.

    Interleaved (actor i takes rates i, i+W, i+2W, ...) rather than in blocks,
    so every actor spans greedy to exploring and losing one actor to a crash
    removes no band of the schedule.
    """
    if not 0 <= actor_index < num_actors:
        raise ValueError(f"actor index {actor_index} outside 0..{num_actors - 1}")
    all_eps = apex_epsilons(num_actors * envs_per_actor, base=base, alpha=alpha)
    return all_eps[actor_index::num_actors].copy()


def epsilon_greedy(
    greedy: npt.NDArray[np.int64],
    epsilons: npt.NDArray[np.float64],
    n_actions: int,
    rng: np.random.Generator,
    legal: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.int64]:
    """Each env's greedy action, replaced by a uniformly random one with that env's ε.

    With `legal` [B, A] (a game's action mask) the random action is a legal
    one; a row with no legal action (a finished game, whose next step only
    resets it) keeps its greedy action.
    """
    explore = rng.random(len(greedy)) < epsilons
    if legal is None:
        random_actions = rng.integers(n_actions, size=len(greedy))
    else:
        # The largest of uniform draws over the legal actions is uniform among them.
        random_actions = np.argmax(rng.random(legal.shape) + legal, axis=1)
        explore &= legal.any(axis=1)
    return np.where(explore, random_actions, greedy).astype(np.int64)
