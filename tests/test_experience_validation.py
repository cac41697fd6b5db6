"""Server-side validation of experience batches: each refusal names its reason."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from fedrl.common.experience import ExperienceBatch
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.experience.validation import (
    InvalidBatchError,
    ValidationLimits,
    validate_batch,
)
from tests.support.experience import SPEC_HASH, cartpole_spec, make_batch

LIMITS = ValidationLimits(max_transitions=1000, reward_bound=100.0, max_n_step=5)


def _validate(batch: ExperienceBatch) -> None:
    validate_batch(batch, spec=cartpole_spec(), spec_hash=SPEC_HASH, limits=LIMITS)


def _with(**columns: object) -> Callable[[ExperienceBatch], ExperienceBatch]:
    return lambda batch: dataclasses.replace(batch, **columns)  # type: ignore[arg-type]


def _poke(name: str, index: int, value: object) -> Callable[[ExperienceBatch], ExperienceBatch]:
    def change(batch: ExperienceBatch) -> ExperienceBatch:
        column = getattr(batch, name).copy()
        column[index] = value
        return dataclasses.replace(batch, **{name: column})

    return change


def test_a_well_formed_n_step_batch_passes() -> None:
    _validate(make_batch(500, n_step=3))


INVALID: list[tuple[str, Callable[[ExperienceBatch], ExperienceBatch], str]] = [
    ("spec hash", _with(env_spec_hash="f" * 64), "env_spec_hash .* differs"),
    ("too many rows", lambda b: make_batch(1001), "1001 transitions"),
    ("n_step too large", lambda b: make_batch(10, n_step=6), "n_step 6"),
    ("gamma", _with(gamma=1.5), "gamma 1.5"),
    ("obs shape", lambda b: dataclasses.replace(b, obs=b.obs[:, :3]), "obs has shape"),
    ("obs dtype", lambda b: dataclasses.replace(b, obs=b.obs.astype(np.float64)), "obs is float64"),
    ("obs NaN", _poke("obs", 3, np.nan), "obs holds NaN"),
    ("next_obs inf", _poke("next_obs", 3, np.inf), "next_obs holds NaN or infinite"),
    ("action too large", _poke("action", 2, 2), "action 2 is outside the action space 0..1"),
    ("negative action", _poke("action", 2, -1), "action -1 is outside"),
    ("reward bound", _poke("reward", 0, 101.0), "reward of magnitude 101 exceeds the bound 100"),
    ("reward NaN", _poke("reward", 0, np.nan), "reward holds NaN"),
    ("discount not gamma^k", _poke("discount", 0, 0.5), "discount 0.5 is not gamma"),
]


@pytest.mark.parametrize(
    ("change", "reason"), [(c, r) for _, c, r in INVALID], ids=[name for name, _, _ in INVALID]
)
def test_invalid_batches_are_refused_with_their_reason(
    change: Callable[[ExperienceBatch], ExperienceBatch], reason: str
) -> None:
    batch = change(make_batch(50, seed=1))

    with pytest.raises(InvalidBatchError, match=reason):
        _validate(batch)


def test_terminated_transition_must_not_bootstrap() -> None:
    batch = make_batch(200, seed=2)
    index = int(np.flatnonzero(batch.terminated)[0])

    with pytest.raises(InvalidBatchError, match="discount must be 0 where terminated"):
        _validate(_poke("discount", index, 0.99)(batch))


def test_continuous_action_space_cannot_exchange() -> None:
    spec = cartpole_spec()
    spec.action_space.kind = tpb.SPACE_KIND_BOX

    with pytest.raises(InvalidBatchError, match="not Discrete"):
        validate_batch(make_batch(5), spec=spec, spec_hash=SPEC_HASH, limits=LIMITS)


def test_limits_refuse_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="reward_bound"):
        ValidationLimits(reward_bound=float("inf"))
