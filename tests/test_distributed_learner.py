"""Two learner ranks on gloo step exactly as one learner on the union of their batches.

Each rank trains on its own batches and the ranks average their gradients
before every optimizer step; one process training with twice the batch, made
of both ranks' batches, must end with the same parameters (up to the order
of float sums). Checked for DQN (Double DQN, Huber loss, clipping, target
updates) and PPO (one minibatch per epoch: a per-rank minibatch normalises
its own advantages, so normalisation is off here).
"""

from __future__ import annotations

from multiprocessing.queues import Queue
from typing import Any

import numpy as np
import pytest
import torch

from fedrl.client.training.distributed import (
    EPISODES_PER_ROUND,
    RankGroup,
    RankPlace,
    RoundLedger,
    outcome_of,
)
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.ppo_learner import PPOConfig, PPOLearner
from fedrl.client.training.replay import SampledBatch
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.client.training.vector_env import EnvShape
from tests.support.ranks import run_two_ranks

OBS = (4,)
BATCH = 16
BLOCK = 2
UPDATES = 8
DQN = LearnerConfig(
    batch_size=BATCH,
    hidden=(32, 32),
    sample_block=BLOCK,
    learning_starts=1,
    target_update_interval=3,
    grad_clip_norm=0.5,
    lr=3e-3,
    device="cpu",
)
PPO = PPOConfig(
    rollout_steps=8,
    epochs=3,
    minibatch_size=10_000,
    normalize_advantages=False,
    ppo_hidden=(16, 16),
    device="cpu",
)
SHAPE = EnvShape(obs_shape=OBS, n_actions=2)


class Draws:
    """A replay that hands out fixed draws in turn (the learner's sampling is not under test)."""

    def __init__(self, draws: list[LearnerTransitions]) -> None:
        self._draws = draws
        self._next = 0

    def __len__(self) -> int:
        return 10**6

    def add(self, batch: LearnerTransitions, *, foreign: bool = False) -> None:
        raise AssertionError("nothing is added in this test")

    def sample(self, batch_size: int, beta: float) -> SampledBatch:
        batch = self._draws[self._next]
        self._next += 1
        assert len(batch) == batch_size
        return SampledBatch(
            batch=batch,
            indices=np.arange(batch_size),
            weights=np.ones(batch_size, np.float32),
            foreign=np.zeros(batch_size, bool),
        )

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        pass


def dqn_draws(rank: int) -> list[LearnerTransitions]:
    rng = np.random.default_rng(100 + rank)
    size = BATCH * BLOCK
    return [
        LearnerTransitions(
            obs=rng.normal(size=(size, *OBS)).astype(np.float32),
            action=rng.integers(0, 2, size),
            reward=rng.normal(size=size).astype(np.float32),
            next_obs=rng.normal(size=(size, *OBS)).astype(np.float32),
            discount=(0.97 * (rng.random(size) > 0.2)).astype(np.float32),
        )
        for _ in range(UPDATES // BLOCK)
    ]


def rollout(rank: int) -> Rollout:
    rng = np.random.default_rng(200 + rank)
    steps, envs = PPO.rollout_steps, 3
    return Rollout(
        obs=rng.normal(size=(steps, envs, *OBS)).astype(np.float32),
        action=rng.integers(0, 2, (steps, envs)),
        log_prob=np.full((steps, envs), np.log(0.5), np.float32),
        value=rng.normal(size=(steps + 1, envs)).astype(np.float32),
        reward=rng.normal(size=(steps, envs)).astype(np.float32),
        terminated=rng.random((steps, envs)) < 0.1,
        truncated=np.zeros((steps, envs), bool),
        valid=np.ones((steps, envs), bool),
    )


def train_dqn(gradients: RankGroup | None, draws: list[LearnerTransitions], batch: int) -> Any:
    config = LearnerConfig(**{**DQN.__dict__, "batch_size": batch})
    learner = Learner(
        obs_shape=OBS, n_actions=2, config=config, replay=Draws(draws), gradients=gradients
    )
    learner.train(UPDATES)
    return learner.weights(), [p.detach().numpy().copy() for p in learner.target.parameters()]


def train_ppo(gradients: RankGroup | None, data: Rollout) -> Any:
    learner = PPOLearner(
        obs_shape=OBS, shape=SHAPE, config=PPO, network=NetworkConfig(), gradients=gradients
    )
    learner.train(data)
    learner.train(data)
    return learner.weights()


def rank_main(rank: int, port: int, results: Queue[Any]) -> None:
    torch.set_num_threads(1)
    group = RankGroup(RankPlace(rank, 2, rank, 2, "127.0.0.1", port), "cpu")
    try:
        dqn = train_dqn(group, dqn_draws(rank), BATCH)
        ppo = train_ppo(group, rollout(rank))
        # The round exchange: counts summed, episodes joined in rank order.
        ledger = RoundLedger()
        ledger.hold(10 + rank, [float(rank)] * (EPISODES_PER_ROUND + 1), [5] * 129)
        if rank == 0:
            ledger.hold_foreign(7.5)
        first = outcome_of(group.exchange(ledger.row(ready=True, stop=rank == 1, changed=False)))
        second = outcome_of(group.exchange(ledger.row(ready=rank == 0, stop=False, changed=True)))
        shared = group.broadcast_state({"tensor": torch.arange(3)} if rank == 0 else None)
        # Plain values only: a torch tensor would cross as a handle to this process's memory.
        results.put((rank, dqn, ppo, first, second, shared["tensor"].tolist()))
    finally:
        group.close()


@pytest.fixture(scope="module")
def two_ranks() -> dict[int, Any]:
    return run_two_ranks(rank_main, timeout_s=120)


def assert_same(left: list[tuple[str, np.ndarray]], right: list[tuple[str, np.ndarray]]) -> None:
    assert [n for n, _ in left] == [n for n, _ in right]
    for (name, a), (_, b) in zip(left, right, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_two_dqn_ranks_end_where_one_learner_on_their_union_ends(
    two_ranks: dict[int, Any], one_torch_thread: None
) -> None:
    union = [
        LearnerTransitions.concat([a, b]) for a, b in zip(dqn_draws(0), dqn_draws(1), strict=True)
    ]
    online, target = train_dqn(None, union, 2 * BATCH)
    for rank in (0, 1):
        rank_online, rank_target = two_ranks[rank][0]
        assert_same(rank_online, online)
        for a, b in zip(rank_target, target, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    alone, _ = train_dqn(None, dqn_draws(0), BATCH)
    # Not a test that cannot fail: rank 0's own batches alone lead elsewhere.
    assert not np.allclose(alone[0][1], online[0][1], atol=1e-4)


def test_two_ppo_ranks_end_where_one_learner_on_their_union_ends(
    two_ranks: dict[int, Any], one_torch_thread: None
) -> None:
    union = train_ppo(None, Rollout.concat([rollout(0), rollout(1)]))
    for rank in (0, 1):
        assert_same(two_ranks[rank][1], union)


def test_a_round_sums_counts_and_foreign_credit_joins_episodes_and_ors_stop_requests(
    two_ranks: dict[int, Any],
) -> None:
    for rank in (0, 1):
        first, second, shared = two_ranks[rank][2:]
        assert first.env_steps == 21
        assert (first.foreign_credit, second.foreign_credit) == (7.5, 0.0)
        assert len(first.episode_returns) == 2 * EPISODES_PER_ROUND
        assert list(first.episode_returns[[0, -1]]) == [0.0, 1.0]
        assert first.stop and first.all_ready and not first.state_changed
        # The episodes past the cap came with the next round; its steps were counted already.
        assert second.env_steps == 0
        assert list(second.episode_returns) == [0.0, 1.0]
        assert list(second.episode_lengths) == [5, 5]
        assert not second.stop and not second.all_ready and second.state_changed
        assert shared == [0, 1, 2]
