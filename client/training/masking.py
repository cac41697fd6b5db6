"""Illegal actions masked where a network's outputs are read: its Q-values or its logits.

A two-player game's observation ends with its legal-action mask
(fedrl.envs.board_games): the last n_actions features are 1 where an action
is legal, 0 where not. A network built for such an env sets the outputs of
illegal actions to `MASKED` as its last operation, so every reader of the
outputs sees them masked with no further work: the actors' argmax (and a
greedy opponent's), Double DQN's argmax over the next state, the target's
max, a PPO policy's log-probabilities, samples, entropy and mode, export,
evaluation and record. The mask travels inside the observation, so the
replay, shared memory and the experience exchange hold it already.

`MASKED` is finite: a terminal state has no legal action, and its bootstrap
(discount 0) must be 0 · max = 0, where −inf would give NaN; a softmax gives
it probability exp(−1e9) = 0 and an entropy term 0 · −1e9 = 0.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

MASKED = -1e9
"""The output of an illegal action: below any Q-value or logit a network learns."""


def masked_outputs(outputs: torch.Tensor, flat_obs: torch.Tensor) -> torch.Tensor:
    """`outputs` [B, A] with every action whose mask feature (the last A of `flat_obs`) is
    below 1/2 set to MASKED."""
    actions = outputs.shape[-1]
    illegal = flat_obs[:, -actions:] < 0.5
    return outputs.masked_fill(illegal, MASKED)


def legal_actions(obs: npt.NDArray[np.float32], n_actions: int) -> npt.NDArray[np.bool_]:
    """The legal actions [B, A] of observations [B, D] that end with their mask."""
    legal: npt.NDArray[np.bool_] = obs.reshape(len(obs), -1)[:, -n_actions:] > 0.5
    return legal
