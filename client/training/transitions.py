"""Columnar n-step transitions in the learner's form: what actors, replay and learner exchange.

Not the form experience travels in between participants: that is
fedrl.common.experience.ExperienceBatch, which keeps termination and
truncation apart and carries its n, gamma and env spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_FLOAT32 = np.dtype(np.float32)


@dataclass(frozen=True)
class LearnerTransitions:
    """B n-step transitions as parallel columns, ready for the TD target.

    The n-step work happens before a transition gets here, so the learner's
    target is simply ``reward + discount * max_a Q(next_obs, a)``: the discount
    already carries gamma**k for the k <= n steps actually taken, and is 0.0
    where the episode terminated within them. Truncation (a time limit) is not
    termination, so it keeps a non-zero discount and bootstraps.
    """

    obs: np.ndarray
    """float32 [B, *obs_shape] (uint8 for images): the observation the action was taken in."""
    action: np.ndarray
    """int64 [B]: the action taken."""
    reward: np.ndarray
    """float32 [B]: sum of gamma**i * r_i over the k steps taken."""
    next_obs: np.ndarray
    """float32 [B, *obs_shape] (uint8 for images): the observation k steps later."""
    discount: np.ndarray
    """float32 [B]: gamma**k to bootstrap with; 0.0 if the episode terminated."""
    opponent: np.ndarray | None = None
    """Two-player games: int64 [B], the league id of each transition's opponent (what the
    experience exchange names); None elsewhere. The replay does not keep it."""

    def __len__(self) -> int:
        return int(self.action.shape[0])

    def validate(
        self, obs_shape: tuple[int, ...], obs_dtype: np.dtype[np.generic] = _FLOAT32
    ) -> None:
        """Raise ValueError naming the first column whose dtype or shape is wrong.

        Checked once at the boundary (actor output, foreign experience) so the
        replay can copy columns without looking at them again. Observations
        are float32, or uint8 images (`obs_dtype`).
        """
        size = len(self)
        expected: tuple[tuple[str, np.dtype[np.generic], tuple[int, ...]], ...] = (
            ("obs", obs_dtype, (size, *obs_shape)),
            ("action", np.dtype(np.int64), (size,)),
            ("reward", np.dtype(np.float32), (size,)),
            ("next_obs", obs_dtype, (size, *obs_shape)),
            ("discount", np.dtype(np.float32), (size,)),
        )
        for name, dtype, shape in expected:
            column = getattr(self, name)
            if not isinstance(column, np.ndarray):
                raise ValueError(
                    f"LearnerTransitions.{name} must be a numpy array, got {type(column)}"
                )
            if column.dtype != dtype:
                raise ValueError(
                    f"LearnerTransitions.{name} has dtype {column.dtype}, expected {dtype}"
                )
            if column.shape != shape:
                raise ValueError(
                    f"LearnerTransitions.{name} has shape {column.shape}, expected {shape} "
                    f"(batch size {size}, obs_shape {obs_shape})"
                )
        if self.opponent is not None and (
            not isinstance(self.opponent, np.ndarray)
            or self.opponent.dtype != np.int64
            or self.opponent.shape != (size,)
        ):
            raise ValueError(f"LearnerTransitions.opponent must be int64 [{size}] or None")
        if size and self.action.min() < 0:
            raise ValueError(
                f"LearnerTransitions.action holds a negative action {self.action.min()}"
            )
        if size and not (np.all(self.discount >= 0.0) and np.all(self.discount <= 1.0)):
            raise ValueError("LearnerTransitions.discount must lie in [0, 1]")
        # One NaN in replay poisons every network trained from it, forever.
        for name in ("obs", "reward", "next_obs"):
            column = getattr(self, name)
            if column.dtype.kind == "f" and not np.all(np.isfinite(column)):
                raise ValueError(f"LearnerTransitions.{name} holds a NaN or infinite value")

    def rows(self, index: np.ndarray | slice) -> LearnerTransitions:
        """The transitions `index` picks (a boolean mask, positions or a slice), in its order."""
        return LearnerTransitions(
            obs=self.obs[index],
            action=self.action[index],
            reward=self.reward[index],
            next_obs=self.next_obs[index],
            discount=self.discount[index],
            opponent=None if self.opponent is None else self.opponent[index],
        )

    @staticmethod
    def concat(batches: Sequence[LearnerTransitions]) -> LearnerTransitions:
        """Join batches end to end (e.g. the slices several actors produced)."""
        if not batches:
            raise ValueError("LearnerTransitions.concat needs at least one batch")
        return LearnerTransitions(
            obs=np.concatenate([b.obs for b in batches]),
            action=np.concatenate([b.action for b in batches]),
            reward=np.concatenate([b.reward for b in batches]),
            next_obs=np.concatenate([b.next_obs for b in batches]),
            discount=np.concatenate([b.discount for b in batches]),
            opponent=(
                None
                if any(b.opponent is None for b in batches)
                else np.concatenate([b.opponent for b in batches if b.opponent is not None])
            ),
        )
