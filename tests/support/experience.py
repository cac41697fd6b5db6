"""Shared pieces of the experience tests: a CartPole-like spec, valid batches, a real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedrl.common.experience import ExperienceBatch
from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import experience_pb2_grpc as pb_grpc
from fedrl.proto.v1 import federation_pb2_grpc as fed_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.experience.exchange import ExperienceConfig
from fedrl.server.experience.service import experience_service
from fedrl.server.experience.store import StoreConfig
from fedrl.server.experience.validation import ValidationLimits
from tests.support.server_harness import InProcessServer, channel, server_config

OBS_SHAPE = (4,)
ACTIONS = 2
GAMMA = 0.99


def cartpole_spec() -> tpb.ModelSpec:
    """A session spec with CartPole's spaces (Box(4) float32, Discrete(2))."""
    high = [4.8, float("inf"), 0.418, float("inf")]
    return tpb.ModelSpec(
        tensors=[tpb.TensorSpec(name="t0", dtype=tpb.DTYPE_FLOAT32, shape=[4, 2])],
        env_id="CartPole-v1",
        observation_space=tpb.SpaceSpec(
            kind=tpb.SPACE_KIND_BOX,
            shape=list(OBS_SHAPE),
            dtype=tpb.DTYPE_FLOAT32,
            low=[-h for h in high],
            high=high,
        ),
        action_space=tpb.SpaceSpec(kind=tpb.SPACE_KIND_DISCRETE, n=ACTIONS, dtype=tpb.DTYPE_INT64),
        algorithm="dqn/test-mlp",
    )


SPEC_HASH = spec_hash(cartpole_spec())


def make_batch(
    rows: int, *, seed: int = 0, n_step: int = 1, gamma: float = GAMMA, spec: str = SPEC_HASH
) -> ExperienceBatch:
    """rows valid transitions: trajectories where next_obs[i] is obs[i + 1] within an episode."""
    rng = np.random.default_rng(seed)
    states = rng.normal(0.0, 0.5, size=(rows + 1, *OBS_SHAPE)).astype(np.float32)
    # Within the spec's Box: the pole angle's bound is 0.418.
    states[:, 2] = np.clip(states[:, 2], -0.4, 0.4)
    terminated = rng.random(rows) < 0.05
    truncated = ~terminated & (rng.random(rows) < 0.01)
    steps = rng.integers(1, n_step + 1, size=rows)
    discount = np.where(terminated, 0.0, gamma**steps).astype(np.float32)
    return ExperienceBatch(
        obs=states[:-1],
        action=rng.integers(0, ACTIONS, size=rows).astype(np.int64),
        reward=rng.normal(1.0, 0.1, size=rows).astype(np.float32),
        next_obs=states[1:],
        discount=discount,
        terminated=terminated,
        truncated=truncated,
        n_step=n_step,
        gamma=gamma,
        env_spec_hash=spec,
    )


def assert_same_batch(got: ExperienceBatch, expected: ExperienceBatch) -> None:
    """Every column equal in value and dtype, and the same metadata."""
    for name, column in expected.columns():
        np.testing.assert_array_equal(getattr(got, name), column, err_msg=name)
        assert getattr(got, name).dtype == column.dtype, name
    assert (got.n_step, got.gamma, got.env_spec_hash) == (
        expected.n_step,
        expected.gamma,
        expected.env_spec_hash,
    )


CONFIG = ExperienceConfig(
    store=StoreConfig(max_bytes=8 << 20, participant_quota_bytes=4 << 20),
    validation=ValidationLimits(max_transitions=5000, reward_bound=50.0),
    chunk_bytes=16 << 10,
)


class Server(InProcessServer):
    """A real server with the experience service, on its own event loop thread."""

    def __init__(self, data_dir: Path, config: ExperienceConfig = CONFIG, **overrides: Any) -> None:
        """`overrides`: ServerConfig fields other than the defaults (server_config)."""
        service = experience_service(data_dir, config)
        super().__init__(server_config(data_dir, **overrides), extra_services=[service])
        self.data_dir = data_dir

    def stubs(self) -> tuple[fed_grpc.FederationStub, pb_grpc.ExperienceExchangeStub]:
        opened = channel(self.address)
        self._channels.append(opened)
        return fed_grpc.FederationStub(opened), pb_grpc.ExperienceExchangeStub(opened)  # type: ignore[no-untyped-call]
