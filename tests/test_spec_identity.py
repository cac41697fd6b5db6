"""Spec hashing names what differs; participant ids are Unicode yet safe everywhere."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedrl.common.identity import (
    METADATA_KEY,
    id_from_metadata,
    id_to_metadata,
    validate_participant_id,
)
from fedrl.common.spec import spec_difference, spec_hash
from fedrl.proto.v1 import tensor_pb2 as pb


def _spec(n_actions: int = 2, hidden: int = 256) -> pb.ModelSpec:
    return pb.ModelSpec(
        tensors=[
            pb.TensorSpec(name="body.0.weight", dtype=pb.DTYPE_FLOAT32, shape=[hidden, 4]),
            pb.TensorSpec(name="head.weight", dtype=pb.DTYPE_FLOAT32, shape=[n_actions, hidden]),
        ],
        env_id="CartPole-v1",
        observation_space=pb.SpaceSpec(
            kind=pb.SPACE_KIND_BOX,
            shape=[4],
            dtype=pb.DTYPE_FLOAT32,
            low=[-4.8, -math.inf, -0.42, -math.inf],
            high=[4.8, math.inf, 0.42, math.inf],
        ),
        action_space=pb.SpaceSpec(kind=pb.SPACE_KIND_DISCRETE, dtype=pb.DTYPE_INT64, n=n_actions),
        algorithm="dqn/dueling-mlp-256x256",
    )


def test_equal_specs_hash_equal_and_show_no_difference() -> None:
    assert spec_hash(_spec()) == spec_hash(_spec())
    assert spec_difference(_spec(), _spec()) is None


def test_action_count_difference_is_named() -> None:
    message = spec_difference(_spec(n_actions=2), _spec(n_actions=3))

    assert message == "action_space.n: session has 2, yours is 3"
    assert spec_hash(_spec(n_actions=2)) != spec_hash(_spec(n_actions=3))


def test_tensor_shape_difference_is_named_with_the_tensor() -> None:
    message = spec_difference(_spec(hidden=256), _spec(hidden=64))

    assert message is not None
    assert message.startswith("tensors[0].shape (body.0.weight)")


def test_env_difference_is_named() -> None:
    other = _spec()
    other.env_id = "Acrobot-v1"

    assert spec_difference(_spec(), other) == (
        "env_id: session has 'CartPole-v1', yours is 'Acrobot-v1'"
    )


def test_infinite_bounds_hash_stably() -> None:
    spec = _spec()
    copy = pb.ModelSpec.FromString(spec.SerializeToString())

    assert spec_hash(spec) == spec_hash(copy)


@pytest.mark.parametrize("name", ["Макар", "alice", "李雷", "José Ramón", "x" * 64])
def test_unicode_ids_are_accepted_and_travel_in_binary_metadata(name: str) -> None:
    key, value = id_to_metadata(name)

    assert key == METADATA_KEY and key.endswith("-bin")
    assert id_from_metadata([("other", "x"), (key, value)]) == name


def test_ids_are_normalised_to_nfc() -> None:
    decomposed = "Jose\u0301"

    assert validate_participant_id(decomposed) == "José"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("a/b", "'/'"),
        ("..", "'.'"),
        (".hidden", "'.'"),
        (" bob", "whitespace"),
        ("bo\x00b", "invisible"),
        ("bob\u200b", "invisible"),
        ("x" * 65, "at most"),
        ("c:d", "':'"),
    ],
)
def test_unsafe_ids_are_refused_with_a_reason(name: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        validate_participant_id(name)


def test_non_utf8_metadata_is_refused() -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        id_from_metadata([(METADATA_KEY, b"\xff\xfe")])


@given(st.text(max_size=80))
def test_any_accepted_id_is_a_single_safe_path_component(raw: str) -> None:
    try:
        pid = validate_participant_id(raw)
    except ValueError:
        return

    assert "/" not in pid and "\\" not in pid and pid not in (".", "..") and pid.strip() == pid
