"""Two learner ranks of the training engine on gloo: foreign experience, and a game's frames.

Every update is a collective, so the ranks must owe the same number of
updates at every round. Other participants' transitions land in rank 0's
shard only (it runs the federation); the replay-ratio credit they earn
reaches every rank with the round's exchange. A game's frames go to each
rank's own frame replay. Both ranks must end with the same updates and the
same weights, target network included: the foreign data lengthens both
ranks' target period alike.
"""

from __future__ import annotations

from multiprocessing.queues import Queue
from typing import Any

import numpy as np
import pytest
import torch

from fedrl.client.training.distributed import RankGroup, RankPlace
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.transitions import LearnerTransitions
from tests.support.ranks import run_two_ranks

POLLS = 8
FOREIGN_AT = 4
"""The poll before which rank 0 takes in foreign transitions: both replays are ready by then."""
FOREIGN = 400
RATIO = 0.5
TARGET_INTERVAL = 10


def foreign_batch() -> LearnerTransitions:
    rng = np.random.default_rng(7)
    return LearnerTransitions(
        obs=rng.normal(size=(FOREIGN, 4)).astype(np.float32),
        action=rng.integers(0, 2, FOREIGN),
        reward=np.ones(FOREIGN, np.float32),
        next_obs=rng.normal(size=(FOREIGN, 4)).astype(np.float32),
        discount=np.full(FOREIGN, 0.99**3, np.float32),
    )


def flat_weights(engine: TrainingEngine) -> list[float]:
    return [float(x) for _, array in engine.weights() for x in array.ravel()]


def flat_target(engine: TrainingEngine) -> list[float]:
    return [float(x) for p in engine.learner.target.parameters() for x in p.detach().ravel()]


def with_foreign_experience(group: RankGroup) -> tuple[int, int, list[float], int, list[float]]:
    engine = TrainingEngine(
        EngineConfig(
            env="CartPole-v1",
            workers=0,
            envs_per_worker=2,
            steps_per_slot=8,
            replay_ratio=RATIO,
            eval_interval=0,
            seed=group.rank,
        ),
        LearnerConfig(
            hidden=(16,),
            batch_size=8,
            learning_starts=32,
            target_update_interval=TARGET_INTERVAL,
            device="cpu",
        ),
        ranks=group,
    )
    with engine:
        for poll in range(POLLS):
            if poll == FOREIGN_AT and group.leads:
                engine.add_foreign(foreign_batch(), credit=1.0)
            engine.poll()
        learner = engine.learner
        assert isinstance(learner, Learner)
        return (
            learner.updates,
            engine.counters.env_steps,
            flat_weights(engine),
            learner.target_period(),
            flat_target(engine),
        )


def on_a_game(group: RankGroup) -> tuple[bool, int, int, list[float]]:
    engine = TrainingEngine(
        EngineConfig(
            env="ALE/Breakout-v5",
            workers=0,
            envs_per_worker=2,
            steps_per_slot=8,
            replay_ratio=0.25,
            eval_interval=0,
            seed=group.rank,
        ),
        LearnerConfig(batch_size=4, learning_starts=32, replay_capacity=1_000, device="cpu"),
        ranks=group,
    )
    with engine:
        for _ in range(POLLS):
            engine.poll()
        replay = engine.replay_size or 0
        return engine.frames, engine.learner.updates, replay, flat_weights(engine)


def rank_main(rank: int, port: int, results: Queue[Any]) -> None:
    torch.set_num_threads(1)
    group = RankGroup(RankPlace(rank, 2, rank, 2, "127.0.0.1", port), "cpu")
    try:
        results.put((rank, with_foreign_experience(group), on_a_game(group)))
    finally:
        group.close()


@pytest.fixture(scope="module")
def two_ranks() -> dict[int, Any]:
    return run_two_ranks(rank_main, timeout_s=180)


def test_foreign_transitions_at_rank_0_earn_every_rank_the_same_updates(
    two_ranks: dict[int, Any],
) -> None:
    (updates_0, steps_0, weights_0, period_0, target_0), _ = two_ranks[0]
    (updates_1, steps_1, weights_1, period_1, target_1), _ = two_ranks[1]
    assert (updates_0, steps_0, period_0) == (updates_1, steps_1, period_1)
    assert period_0 > TARGET_INTERVAL
    # The foreign transitions' credit, spread over both ranks' updates: far more
    # updates than the ranks' own steps earn (2 ranks x 2 envs x 8 steps a poll).
    own = RATIO * POLLS * 2 * 2 * 8 / 2
    assert updates_0 >= RATIO * FOREIGN / 2 > own
    np.testing.assert_allclose(weights_0, weights_1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(target_0, target_1, rtol=1e-5, atol=1e-6)


def test_two_ranks_train_a_game_from_their_own_frame_replays_in_step(
    two_ranks: dict[int, Any],
) -> None:
    _, (frames_0, updates_0, replay_0, weights_0) = two_ranks[0]
    _, (frames_1, updates_1, replay_1, weights_1) = two_ranks[1]
    assert frames_0 and frames_1
    assert updates_0 == updates_1 > 0
    assert replay_0 > 0 and replay_1 > 0
    np.testing.assert_allclose(weights_0, weights_1, rtol=1e-5, atol=1e-6)
