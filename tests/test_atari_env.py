"""Atari by id: ale-py's native env, preprocessed as standard; raw scores, clipped training."""

from __future__ import annotations

import numpy as np
import pytest

from fedrl.client.training.actor import make_actor_spec
from fedrl.client.training.frame_actor import FrameActorCore, FrameActorSpec
from fedrl.client.training.vector_env import env_shape, make_vector_env, reset_seeded
from fedrl.envs.atari import FRAME_SIZE, FRAME_STACK, is_atari
from tests.support.frame_env import ENV_ID, register

BREAKOUT = "ALE/Breakout-v5"


def test_atari_ids_make_stacks_of_four_84x84_greyscale_uint8_frames() -> None:
    env = make_vector_env(BREAKOUT, 2)
    try:
        shape = env_shape(env)
        obs = reset_seeded(env, np.random.SeedSequence(0))
        next_obs, _, terminated, truncated, info = env.step(np.zeros(2, dtype=np.int64))
    finally:
        env.close()

    assert is_atari(BREAKOUT) and not is_atari("CartPole-v1")
    assert shape.obs_shape == (FRAME_STACK, FRAME_SIZE, FRAME_SIZE) == (4, 84, 84)
    assert shape.n_actions == 4
    assert obs.dtype == np.uint8 and obs.shape == (2, 4, 84, 84)
    # After a reset the missing history is zeros, the newest frame the screen.
    assert not obs[:, :3].any() and obs[:, 3].any()
    # The next stack moves one frame on.
    np.testing.assert_array_equal(np.asarray(next_obs)[:, :3], obs[:, 1:])
    assert "lives" in info and np.asarray(info["lives"]).tolist() == [5, 5]
    assert np.asarray(terminated).dtype == np.bool_ and np.asarray(truncated).dtype == np.bool_


def test_envs_of_one_batch_start_from_different_seeds() -> None:
    env = make_vector_env(BREAKOUT, 4)
    try:
        reset_seeded(env, np.random.SeedSequence(1))
        frames = [np.asarray(env.step(np.full(4, 3, dtype=np.int64))[0]) for _ in range(40)]
    finally:
        env.close()

    last = frames[-1][:, -1]
    assert len({frame.tobytes() for frame in last}) > 1


def test_the_env_reports_raw_scores_above_one() -> None:
    env = make_vector_env("ALE/SpaceInvaders-v5", 4)
    rng = np.random.default_rng(0)
    try:
        reset_seeded(env, np.random.SeedSequence(0))
        rewards = np.concatenate(
            [np.asarray(env.step(rng.integers(6, size=4))[1]) for _ in range(400)]
        )
    finally:
        env.close()

    assert rewards.max() > 1  # an alien is worth 5 to 30 points: nothing clips them here


def test_unknown_games_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="ALE/NoSuchGame-v5"):
        make_vector_env("ALE/NoSuchGame-v5", 1)


def test_actors_learn_from_clipped_rewards_while_episodes_score_raw() -> None:
    register()
    spec = make_actor_spec(
        0,
        num_actors=1,
        generation=0,
        seed_root=np.random.SeedSequence(5),
        env_id=ENV_ID,
        num_envs=2,
        exploration_base=0.5,
        exploration_alpha=1.0,
        n_step=1,
        gamma=0.9,
        hidden=(8,),
        dueling=False,
        steps_per_slot=300,
    )
    actor = FrameActorCore(FrameActorSpec(spec, clip_rewards=True, episodic_life=False))

    got = actor.collect(300)

    log = actor.env.log
    raw = np.stack([step.reward for step in log])  # scripted rewards lie in -2..3
    assert set(np.unique(got.segment.reward)) <= {-1.0, 0.0, 1.0}
    assert np.abs(raw).max() > 1
    assert len(got.episode_returns) > 0
    # The first game to end scores the sum of its raw rewards.
    t, e = next(
        (t, e) for t, s in enumerate(log) for e in range(2) if s.terminated[e] or s.truncated[e]
    )
    assert got.episode_returns[0] == pytest.approx(sum(s.reward[e] for s in log[: t + 1]))
