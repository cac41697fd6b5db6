"""Between the learner's transitions and the shared ExperienceBatch that participants exchange.

The learner folds termination into the discount and forgets truncation;
an ExperienceBatch (fedrl.common.experience) keeps both flags and says
which n and gamma made it, so a receiver can check it fits.
"""

from __future__ import annotations

import numpy as np

from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import observation_dtype
from fedrl.common.experience import ExperienceBatch


def to_experience(
    batch: LearnerTransitions, *, n_step: int, gamma: float, spec_hash: str
) -> ExperienceBatch:
    """A local batch as an ExperienceBatch.

    A LearnerTransitions folds termination into its discount (0.0) and does not
    keep truncation, which bootstraps like an ongoing episode; so terminated
    is discount == 0 and truncated is False.
    """
    terminated = batch.discount == 0.0
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
