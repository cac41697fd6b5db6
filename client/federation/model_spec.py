"""The model's description for a session: the spec the server compares at Join."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

from fedrl.client.training.cnn import is_image
from fedrl.client.training.vector_env import env_shape, make_vector_env
from fedrl.proto.v1 import tensor_pb2 as tpb


def model_spec(
    env_id: str,
    weights: Sequence[tuple[str, np.ndarray]],
    algorithm: str,
    *,
    data: str | None = None,
) -> tpb.ModelSpec:
    """The ModelSpec of a network over a Gymnasium env: its tensors, spaces and family.

    `data` is the env's data file (--data), when it takes one: spaces may depend on it.
    The spaces are the env's own; a transformer's observation window shows in
    the tensors' shapes and in the algorithm name.
    """
    env = make_vector_env(env_id, 1, data)
    try:
        shape = env_shape(env, continuous=True)
        observation = env.single_observation_space
    finally:
        env.close()
    # make_vector_env has checked it already; the assert narrows the type.
    assert isinstance(observation, gym.spaces.Box)
    if shape.discrete:
        action = tpb.SpaceSpec(
            kind=tpb.SPACE_KIND_DISCRETE, shape=[], dtype=tpb.DTYPE_INT64, n=shape.n_actions
        )
    else:
        action = tpb.SpaceSpec(
            kind=tpb.SPACE_KIND_BOX,
            shape=[shape.action_dim],
            dtype=tpb.DTYPE_FLOAT32,
            low=list(shape.action_low),
            high=list(shape.action_high),
        )
    return tpb.ModelSpec(
        tensors=[
            tpb.TensorSpec(name=name, dtype=tpb.DTYPE_FLOAT32, shape=list(array.shape))
            for name, array in weights
        ],
        env_id=env_id,
        observation_space=observation_spec(observation),
        action_space=action,
        algorithm=algorithm,
    )


def observation_spec(observation: gym.spaces.Box) -> tpb.SpaceSpec:
    """The spec of what the engine feeds the network: float32, or uint8 for images (frame
    stacks), whose bounds are their dtype's and so go unsaid (28k of them for Atari)."""
    image = observation.dtype == np.uint8 and is_image(observation.shape)
    full_range = image and bool(np.all(observation.low == 0) and np.all(observation.high == 255))
    return tpb.SpaceSpec(
        kind=tpb.SPACE_KIND_BOX,
        shape=list(observation.shape),
        dtype=tpb.DTYPE_UINT8 if image else tpb.DTYPE_FLOAT32,
        low=[] if full_range else [float(v) for v in np.ravel(observation.low)],
        high=[] if full_range else [float(v) for v in np.ravel(observation.high)],
    )
