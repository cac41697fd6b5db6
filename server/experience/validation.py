"""Is a decoded experience batch fit for a session? A pure check with a precise reason.

Everything another participant's learner will train on passes here first:
one NaN or out-of-range action in a shared replay poisons every network
that samples it, and the participant who sent it may not even know.

Observations are checked for shape, dtype, finiteness and the Box bounds
the session's spec declares (an unbounded side, ±inf, checks nothing): a
value no environment of the session can produce is either a bug or an
attack, and the learners of everyone else would train on it. A spec without
bounds (empty low/high) has only its shape and dtype checked; Join refuses
bounds that do not fit the shape (federation/checks.py check_spec).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedrl.common.experience import ExperienceBatch
from fedrl.common.serde import DTYPE_NAMES
from fedrl.proto.v1 import tensor_pb2 as tpb

# Decoded numpy dtype of each wire dtype a space may declare.
_SPACE_DTYPES: dict[int, np.dtype[np.generic]] = {
    tpb.DTYPE_FLOAT32: np.dtype(np.float32),
    tpb.DTYPE_FLOAT16: np.dtype(np.float32),
    tpb.DTYPE_BFLOAT16: np.dtype(np.float32),
    tpb.DTYPE_INT64: np.dtype(np.int64),
    tpb.DTYPE_INT32: np.dtype(np.int32),
    tpb.DTYPE_UINT8: np.dtype(np.uint8),
    tpb.DTYPE_BOOL: np.dtype(np.bool_),
}

# float32 rounding of gamma**k, with room for a client computing in float64.
_DISCOUNT_TOLERANCE = 1e-5


@dataclass(frozen=True)
class ValidationLimits:
    """What the server accepts in one experience batch."""

    max_transitions: int = 10_000
    """Rows in one batch; a sync pushes what was collected since the last one, not the replay."""
    reward_bound: float = 1e6
    """Largest |reward| accepted: a bound on the damage one bad batch can do to TD targets."""
    max_n_step: int = 100
    """Largest n of n-step returns; beyond it the batch is not a DQN's."""

    def __post_init__(self) -> None:
        if self.max_transitions < 1 or self.max_n_step < 1:
            raise ValueError("max_transitions and max_n_step must be at least 1")
        if not (math.isfinite(self.reward_bound) and self.reward_bound > 0):
            raise ValueError(f"reward_bound must be positive and finite, got {self.reward_bound}")


class InvalidBatchError(ValueError):
    """A batch the session refuses; the message is the reason sent to the participant."""


def validate_batch(
    batch: ExperienceBatch, *, spec: tpb.ModelSpec, spec_hash: str, limits: ValidationLimits
) -> None:
    """Raise InvalidBatchError with the first reason batch does not fit the session."""
    if batch.env_spec_hash != spec_hash:
        raise InvalidBatchError(
            f"env_spec_hash {batch.env_spec_hash or '(empty)'} differs from the session's "
            f"{spec_hash}: the transitions come from another environment or model"
        )
    rows = len(batch)
    if not 1 <= rows <= limits.max_transitions:
        raise InvalidBatchError(
            f"batch has {rows} transitions; between 1 and {limits.max_transitions} are accepted"
        )
    if not 1 <= batch.n_step <= limits.max_n_step:
        raise InvalidBatchError(f"n_step {batch.n_step} is outside 1..{limits.max_n_step}")
    if not (math.isfinite(batch.gamma) and 0.0 < batch.gamma <= 1.0):
        raise InvalidBatchError(f"gamma {batch.gamma} is outside (0, 1]")
    _check_observations(batch, spec.observation_space)
    _check_actions(batch.action, spec.action_space)
    _check_rewards(batch.reward, limits.reward_bound)
    _check_discounts(batch)


def _check_observations(batch: ExperienceBatch, space: tpb.SpaceSpec) -> None:
    expected_dtype = _SPACE_DTYPES.get(space.dtype)
    if space.kind != tpb.SPACE_KIND_BOX or expected_dtype is None:
        raise InvalidBatchError("the session's observation space is not a Box; it cannot exchange")
    shape = (len(batch), *space.shape)
    for name in ("obs", "next_obs"):
        column: np.ndarray = getattr(batch, name)
        if column.shape != shape:
            raise InvalidBatchError(
                f"{name} has shape {list(column.shape)}; the observation space needs {list(shape)}"
            )
        if column.dtype != expected_dtype:
            raise InvalidBatchError(
                f"{name} is {column.dtype}; the observation space is "
                f"{DTYPE_NAMES.get(space.dtype, space.dtype)}"
            )
        if column.dtype.kind == "f" and not np.isfinite(column).all():
            raise InvalidBatchError(f"{name} holds NaN or infinite values")
        _check_bounds(name, column, space)


def _check_bounds(name: str, column: np.ndarray, space: tpb.SpaceSpec) -> None:
    """Every value within the Box's low..high, element by element."""
    if not space.low and not space.high:
        return
    shape = tuple(space.shape)
    for side, bound, outside in (("low", space.low, np.less), ("high", space.high, np.greater)):
        limits = np.asarray(bound, dtype=np.float64).reshape(shape)
        bad = outside(column, limits)
        if bad.any():
            row, *element = np.unravel_index(int(np.argmax(bad)), bad.shape)
            value = column[(row, *element)]
            raise InvalidBatchError(
                f"{name}[{row}] element {list(map(int, element))} is {value}, outside the "
                f"observation space's {side} bound {limits[tuple(element)]}"
            )


def _check_actions(action: np.ndarray, space: tpb.SpaceSpec) -> None:
    if space.kind != tpb.SPACE_KIND_DISCRETE or space.n < 1:
        raise InvalidBatchError("the session's action space is not Discrete; it cannot exchange")
    if action.ndim != 1 or action.dtype.kind not in "iu":
        raise InvalidBatchError(f"action must be integers of shape [B], got {action.dtype}")
    low, high = int(action.min()), int(action.max())
    if low < 0 or high >= space.n:
        bad = low if low < 0 else high
        raise InvalidBatchError(f"action {bad} is outside the action space 0..{space.n - 1}")


def _check_rewards(reward: np.ndarray, bound: float) -> None:
    if not np.isfinite(reward).all():
        raise InvalidBatchError("reward holds NaN or infinite values")
    largest = float(np.abs(reward).max())
    if largest > bound:
        raise InvalidBatchError(f"reward of magnitude {largest:g} exceeds the bound {bound:g}")


def _check_discounts(batch: ExperienceBatch) -> None:
    """Each discount is gamma**k for some k in 1..n, or 0 where the episode terminated."""
    discount = batch.discount.astype(np.float64)
    if not np.isfinite(discount).all():
        raise InvalidBatchError("discount holds NaN or infinite values")
    if np.any(discount[batch.terminated] != 0.0):
        raise InvalidBatchError("discount must be 0 where terminated is set")
    powers = batch.gamma ** np.arange(1, batch.n_step + 1, dtype=np.float64)
    live = discount[~batch.terminated]
    nearest = np.abs(live[:, None] - powers[None, :]).min(axis=1) if live.size else live
    wrong = nearest > _DISCOUNT_TOLERANCE
    if np.any(wrong):
        value = float(live[np.argmax(wrong)])
        raise InvalidBatchError(
            f"discount {value:g} is not gamma**k for k in 1..{batch.n_step} "
            f"(gamma {batch.gamma:g}) and the transition did not terminate"
        )
