"""Between the learner's transitions and the shared ExperienceBatch that participants exchange.

The learner folds termination into the discount and forgets truncation;
an ExperienceBatch (fedrl.common.experience) keeps both flags and says
which n and gamma made it, so a receiver can check it fits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import observation_dtype
from fedrl.common.experience import ExperienceBatch


def to_experience(
    batch: LearnerTransitions,
    *,
    n_step: int,
    gamma: float,
    spec_hash: str,
    opponent_name: Callable[[int], str] | None = None,
) -> ExperienceBatch:
    """A local batch as an ExperienceBatch.

    A LearnerTransitions folds termination into its discount (0.0) and does not
    keep truncation, which bootstraps like an ongoing episode; so terminated
    is discount == 0 and truncated is False. A two-player game's transitions
    carry their opponents' league ids, which travel as the names
    `opponent_name` gives them.
    """
    terminated = batch.discount == 0.0
    opponent: np.ndarray | None = None
    opponents: tuple[str, ...] = ()
    if batch.opponent is not None and opponent_name is not None:
        ids, opponent = np.unique(batch.opponent, return_inverse=True)
        opponents = tuple(opponent_name(int(i)) for i in ids)
        opponent = opponent.astype(np.int32)
    return ExperienceBatch(
        obs=batch.obs,
        action=batch.action,
        reward=batch.reward,
        next_obs=batch.next_obs,
        discount=batch.discount,
        terminated=terminated,
        truncated=np.zeros_like(terminated),
        n_step=n_step,
        gamma=gamma,
        env_spec_hash=spec_hash,
        opponent=opponent,
        opponents=opponents,
    )


def to_transitions(batch: ExperienceBatch) -> LearnerTransitions:
    """A pulled batch as learner columns (float32 observations, uint8 images, int64 actions)."""
    obs_dtype = observation_dtype(batch.obs.shape[1:])
    return LearnerTransitions(
        obs=batch.obs.astype(obs_dtype, copy=False),
        action=batch.action.astype(np.int64, copy=False),
        reward=batch.reward.astype(np.float32, copy=False),
        next_obs=batch.next_obs.astype(obs_dtype, copy=False),
        # Terminated rows bootstrap from nothing, whatever the sender wrote.
        discount=np.where(batch.terminated, 0.0, batch.discount).astype(np.float32),
    )
