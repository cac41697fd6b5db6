"""PPO's rollout slots hold Atari's stacks as single frames and give back exactly the stacks."""

from __future__ import annotations

import numpy as np
import pytest

from fedrl.client.training.frame_stacks import join_stacks, split_stacks
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.shm import RolloutLayout, SlotFill, SlotRing
from tests.support.frame_env import OBS_SHAPE, ScriptedFrameEnv


def scripted_stacks(steps: int, envs: int, seed: int) -> np.ndarray:
    """[steps, envs, k, H, W] observations of the scripted game: resets, lives, black frames."""
    env = ScriptedFrameEnv(envs)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    seen = [obs]
    for _ in range(steps - 1):
        obs, *_ = env.step(rng.integers(3, size=envs))
        seen.append(obs)
    return np.stack(seen)


def rollout_of(obs: np.ndarray) -> Rollout:
    steps, envs = obs.shape[:2]
    zeros = np.zeros((steps, envs), dtype=np.float32)
    return Rollout(
        obs=obs,
        action=np.zeros((steps, envs), dtype=np.int64),
        log_prob=zeros,
        value=np.zeros((steps + 1, envs), dtype=np.float32),
        reward=zeros,
        terminated=np.zeros((steps, envs), dtype=np.bool_),
        truncated=np.zeros((steps, envs), dtype=np.bool_),
        valid=np.ones((steps, envs), dtype=np.bool_),
    )


@pytest.mark.parametrize("seed", range(5))
def test_stacks_split_into_frames_join_back_exactly_across_game_starts(seed: int) -> None:
    obs = scripted_stacks(60, 3, seed)

    frames, first, starts = split_stacks(obs)

    np.testing.assert_array_equal(join_stacks(frames, first, starts), obs)
    assert starts.any()  # the scripted games end and restart within 60 steps


def test_a_rollout_slot_of_frames_takes_about_a_quarter_and_reads_back_the_same() -> None:
    obs = scripted_stacks(32, 4, 1)
    kwargs = {"num_slots": 1, "steps": 32, "envs": 4, "obs_shape": OBS_SHAPE}
    layout = RolloutLayout(**kwargs, action_shape=(), obs_dtype="uint8", frame_stacks=True)
    stacked = RolloutLayout(**kwargs, action_shape=(), obs_dtype="uint8")
    ring = SlotRing(layout)
    try:
        ring.slots[0].write(rollout_of(obs), np.zeros(0), np.zeros(0, dtype=np.int64))

        back, _, _ = ring.slots[0].read(SlotFill(slot=0, rows=0, episodes=0, env_steps=0))

        np.testing.assert_array_equal(back.obs, obs)
    finally:
        ring.close()
    assert layout.slot_bytes < 0.3 * stacked.slot_bytes


def test_observations_that_are_not_frame_stacks_are_refused() -> None:
    obs = np.random.default_rng(0).integers(0, 256, (4, 2, *OBS_SHAPE), dtype=np.uint8)

    with pytest.raises(ValueError, match="not frame stacks"):
        split_stacks(obs)
