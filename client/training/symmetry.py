"""A board game's symmetries applied to the learner's batches: every transition, every time it is
drawn, in one of its board's symmetries picked at random.

A two-player game's value is the same in each symmetry of its board
(fedrl.envs.board_games.GameRules.symmetries): connect four's mirror image,
tic-tac-toe's eight rotations and reflections. Drawing the symmetry per
sample and per update shows the Q-network a position and its images as one
would from games played that way, at no cost in env steps or replay memory,
and without a second forward pass. The transform is a gather of feature
columns and a lookup of the action, so it runs on the learner's device, in
the captured CUDA graph of the device update too (its draw comes from the
device's default generator, which a graph replays correctly).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from fedrl.client.training.device_replay import DeviceBatch


class BatchSymmetries:
    """Transforms a batch's observations, next observations and actions by random symmetries."""

    def __init__(
        self,
        features: npt.NDArray[np.int64],
        actions: npt.NDArray[np.int64],
        *,
        obs_features: int,
        n_actions: int,
        device: torch.device,
    ) -> None:
        """`features` [S, obs_features] and `actions` [S, n_actions], as GameRules.symmetries
        gives them; ValueError where they do not fit the learner's observations or actions."""
        if features.ndim != 2 or features.shape[1] != obs_features:
            raise ValueError(
                f"symmetries over {features.shape[1:]} features do not fit observations of "
                f"{obs_features}"
            )
        if actions.shape != (len(features), n_actions):
            raise ValueError(
                f"symmetries' actions are {actions.shape}, expected ({len(features)}, {n_actions})"
            )
        for name, table, size in (
            ("features", features, obs_features),
            ("actions", actions, n_actions),
        ):
            if not (np.sort(table, axis=1) == np.arange(size)).all():
                raise ValueError(f"each symmetry's {name} must be a permutation of 0..{size - 1}")
        self.count = len(features)
        self._features = torch.as_tensor(features, dtype=torch.int64, device=device)
        self._actions = torch.as_tensor(actions, dtype=torch.int64, device=device)

    def apply(self, batch: DeviceBatch) -> DeviceBatch:
        """The batch with each transition in a symmetry of its own, drawn uniformly."""
        size = batch.action.shape[0]
        drawn = torch.randint(self.count, (size,), device=self._features.device)
        columns = self._features[drawn]
        return batch._replace(
            obs=batch.obs.reshape(size, -1).gather(1, columns).reshape(batch.obs.shape),
            next_obs=batch.next_obs.reshape(size, -1)
            .gather(1, columns)
            .reshape(batch.next_obs.shape),
            action=self._actions[drawn, batch.action.long()].to(batch.action.dtype),
        )
