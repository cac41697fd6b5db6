"""The native vector env: picked by make_vec, identical to single envs, Gymnasium's autoreset."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from fedrl.envs import ENV_ID
from fedrl.envs.features import WARMUP
from fedrl.envs.trading import TradingEnv
from fedrl.envs.trading_vector import TradingVectorEnv

# Short episodes over a small market: many autoresets within a few hundred steps.
OPTIONS: dict[str, Any] = {"synthetic_bars": 3_000, "episode_length": 17, "window": 8}


def test_make_vec_picks_the_native_vector_env_with_next_step_autoreset() -> None:
    envs = gym.make_vec(ENV_ID, num_envs=64, **OPTIONS)

    obs, _ = envs.reset(seed=0)

    assert isinstance(envs, TradingVectorEnv)
    assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert obs.shape == (64, 8 * 6 + 2) and obs.dtype == np.float32
    assert envs.single_observation_space == TradingEnv(**OPTIONS).observation_space


def test_native_vector_env_matches_sync_vector_env_of_single_envs_step_for_step() -> None:
    native = gym.make_vec(ENV_ID, num_envs=8, vectorization_mode="vector_entry_point", **OPTIONS)
    sync = gym.make_vec(ENV_ID, num_envs=8, vectorization_mode="sync", **OPTIONS)
    rng = np.random.default_rng(0)

    native_obs, _ = native.reset(seed=42)
    sync_obs, _ = sync.reset(seed=42)
    np.testing.assert_array_equal(native_obs, sync_obs)
    ends = 0
    for _ in range(200):
        actions = rng.integers(0, 3, 8)
        ours = native.step(actions)
        theirs = sync.step(actions)
        for got, want in zip(ours[:4], theirs[:4], strict=True):
            np.testing.assert_array_equal(got, want)
        ends += int(np.sum(ours[3]))

    assert ends > 50  # autoreset was exercised many times


def test_one_env_vector_trajectory_equals_the_single_env_driven_by_hand() -> None:
    vector = TradingVectorEnv(num_envs=1, **OPTIONS)
    single = TradingEnv(**OPTIONS)
    actions = np.random.default_rng(1).integers(0, 3, 100)

    vector_obs, _ = vector.reset(seed=9)
    single_obs, _ = single.reset(seed=9)
    np.testing.assert_array_equal(vector_obs[0], single_obs)
    single_done = False
    for action in actions:
        obs, reward, terminated, truncated, _ = vector.step(np.array([action]))
        if single_done:
            # NEXT_STEP autoreset: this step only starts the next episode.
            expected_obs, _ = single.reset()
            expected = (expected_obs, 0.0, False, False)
        else:
            step = single.step(int(action))
            expected = step[:4]
        np.testing.assert_array_equal(obs[0], expected[0])
        assert (float(reward[0]), bool(terminated[0]), bool(truncated[0])) == (
            float(expected[1]),
            expected[2],
            expected[3],
        )
        single_done = bool(terminated[0] or truncated[0])


def test_vector_reset_accepts_a_list_of_seeds() -> None:
    envs = TradingVectorEnv(num_envs=3, **OPTIONS)

    listed, _ = envs.reset(seed=[5, 6, 7])
    counted, _ = envs.reset(seed=5)

    np.testing.assert_array_equal(listed, counted)
    with pytest.raises(ValueError, match="reset got 2 seeds for 3 envs"):
        envs.reset(seed=[1, 2])


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        (np.array([0, 1]), r"actions must be 3 integers, got shape \(2,\)"),
        (np.array([0.0, 1.0, 2.0]), "actions must be 3 integers, got shape .* of float64"),
        (np.array([0, 1, 3]), r"actions must lie in \[0, 2\], got 0 to 3"),
    ],
)
def test_bad_action_batches_are_refused(actions: np.ndarray, message: str) -> None:
    envs = TradingVectorEnv(num_envs=3, **OPTIONS)
    envs.reset(seed=0)

    with pytest.raises(ValueError, match=message):
        envs.step(actions)


def test_step_before_reset_is_refused() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        TradingVectorEnv(num_envs=2, **OPTIONS).step(np.array([0, 1]))


def test_ruined_env_terminates_then_restarts_cleanly(tmp_path: Path) -> None:
    # Flat at 100, then 250: a short from the first usable bar loses everything.
    closes = [100.0] * (WARMUP + 1) + [250.0] * 20
    rows = [f"{i * 3_600_000},{c},{c},{c},{c},1" for i, c in enumerate(closes)]
    data = tmp_path / "doubling.csv"
    data.write_text("timestamp,open,high,low,close,volume\n" + "\n".join(rows) + "\n")
    envs = TradingVectorEnv(
        num_envs=2, data=str(data), window=1, episode_length=None, eval_fraction=0.02
    )
    envs.reset(seed=0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NaN from the ruined account's log-equity
        _, rewards, terminated, truncated, _ = envs.step(np.array([0, 1]))
        _, after_rewards, after_terminated, _, _ = envs.step(np.array([2, 1]))

    assert terminated.tolist() == [True, False] and not truncated.any()
    assert rewards[0] < -10 and rewards[1] == 0.0
    assert after_rewards[0] == 0.0 and not after_terminated.any()
