"""The single trading env: Gymnasium's checks, hand-computed costs, splits, episodes, errors."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from fedrl.envs import ENV_ID
from fedrl.envs.features import WARMUP
from fedrl.envs.trading import TradingEnv

HOUR_MS = 3_600_000
T0_MS = 1_704_067_200_000


def write_closes(path: Path, closes: list[float]) -> Path:
    """Bars whose open, high, low and close all equal the given closes."""
    rows = [f"{T0_MS + i * HOUR_MS},{c},{c},{c},{c},1000" for i, c in enumerate(closes)]
    path.write_text("timestamp,open,high,low,close,volume\n" + "\n".join(rows) + "\n")
    return path


def test_env_passes_gymnasium_check_env_without_warnings() -> None:
    env = gym.make(ENV_ID).unwrapped  # through make, so it has a spec to check

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)


def test_make_by_id_passes_options_through() -> None:
    env = gym.make(ENV_ID, window=4, allow_short=False, synthetic_bars=3_000)

    obs, _ = env.reset(seed=0)

    assert isinstance(env.unwrapped, TradingEnv)
    assert env.action_space == gym.spaces.Discrete(2)
    assert obs.shape == (4 * 6 + 2,)
    assert obs.dtype == np.float32


def test_unknown_option_lists_the_valid_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown trading environment option\(s\) windw; valid"):
        gym.make(ENV_ID, windw=4)


def test_fees_and_slippage_match_a_hand_computed_sequence_of_trades(tmp_path: Path) -> None:
    # window=1 makes bar WARMUP the first usable one; episode_length=None starts there.
    f = WARMUP
    closes = [100.0] * f + [100.0, 110.0, 99.0, 99.0, 120.0, 120.0] + [120.0] * 10
    env = TradingEnv(
        data=str(write_closes(tmp_path / "bars.csv", closes)),
        window=1,
        episode_length=None,
        eval_fraction=10 / len(closes),
        fee_bps=10,
        slippage_bps=5,
    )
    _, info = env.reset(seed=0)
    assert info["bar"] == f
    fee, slip = 0.001, 0.0005

    # Bar f, close 100: flat -> long, spending all equity (1.0) on units at 100.05 plus fee.
    units = 1.0 / (100 * (1 + slip) * (1 + fee))
    cash = 1.0 - units * 100 * (1 + slip) * (1 + fee)
    assert cash == pytest.approx(0.0, abs=1e-15)
    equity_1 = cash + units * 110
    # Bar f+1, close 110: stay long, no trade; marked at 99.
    equity_2 = cash + units * 99
    # Bar f+2, close 99: long -> short worth the equity: sell at 99 * (1 - slip).
    short_units = -equity_2 / (99 * (1 - slip) * (1 + fee))
    sold = units - short_units
    cash += sold * 99 * (1 - slip) * (1 - fee)
    equity_3 = cash + short_units * 99
    # Bar f+3, close 99: short -> flat: buy back at 99 * (1 + slip).
    cash -= -short_units * 99 * (1 + slip) * (1 + fee)
    equity_4 = cash
    # Bar f+4, close 120: stay flat.
    expected = [equity_1, equity_2, equity_3, equity_4, equity_4]

    rewards, equities, positions, ends = [], [], [], []
    for action in [2, 2, 0, 1, 1]:  # long, long, short, flat, flat
        _, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        equities.append(info["equity"])
        positions.append(info["position"])
        ends.append((terminated, truncated))

    np.testing.assert_allclose(equities, expected, rtol=1e-12)
    previous = [1.0, *expected[:-1]]
    np.testing.assert_allclose(rewards, np.log(np.array(expected) / previous), rtol=1e-9)
    assert math.isclose(sum(rewards), math.log(equity_4), rel_tol=1e-12)
    assert positions == [1, 1, -1, 0, 0]
    # The last training bar is reached: the episode is cut, not failed.
    assert ends == [(False, False)] * 4 + [(False, True)]


def test_a_short_through_a_doubling_ruins_the_account(tmp_path: Path) -> None:
    closes = [100.0] * (WARMUP + 1) + [250.0] * 20
    env = TradingEnv(
        data=str(write_closes(tmp_path / "bars.csv", closes)),
        window=1,
        episode_length=None,
        eval_fraction=0.02,
    )
    env.reset(seed=0)

    _, reward, terminated, truncated, _ = env.step(0)

    assert terminated and not truncated
    assert math.isfinite(float(reward)) and float(reward) < -10
    with pytest.raises(RuntimeError, match="reset"):
        env.step(1)


def test_training_episodes_never_see_evaluation_bars_and_the_reverse() -> None:
    train = TradingEnv(episode_length=64, synthetic_bars=4_000, eval_fraction=0.25)
    evaluation = TradingEnv(
        episode_length=64, synthetic_bars=4_000, eval_fraction=0.25, split="eval"
    )
    (split_at,) = train.market.split_at
    assert split_at == 3_000

    for env, after_split in ((train, False), (evaluation, True)):
        rng = np.random.default_rng(0)
        for episode in range(30):
            _, info = env.reset(seed=episode)
            bars = [info["bar"]]
            done = False
            while not done:
                _, _, terminated, truncated, info = env.step(int(rng.integers(0, 3)))
                bars.append(info["bar"])
                done = terminated or truncated
            assert all((bar >= split_at) == after_split for bar in bars)
            assert len(bars) == 65


def test_episodes_start_at_random_bars_reproducible_by_seed() -> None:
    env = TradingEnv(synthetic_bars=4_000)

    starts = [env.reset(seed=s)[1]["bar"] for s in range(10)]
    again = [env.reset(seed=s)[1]["bar"] for s in range(10)]

    assert starts == again
    assert len(set(starts)) > 5


def test_without_short_the_actions_are_flat_and_long() -> None:
    env = TradingEnv(allow_short=False, synthetic_bars=3_000)
    env.reset(seed=0)

    positions = [env.step(a)[4]["position"] for a in (1, 0, 1)]

    assert env.action_space == gym.spaces.Discrete(2)
    assert positions == [1, 0, 1]


def test_observation_ends_with_position_and_unrealised_return() -> None:
    env = TradingEnv(synthetic_bars=3_000, fee_bps=0, slippage_bps=0)
    env.reset(seed=1)

    obs, _, _, _, info = env.step(2)
    entry = env.market.close[info["bar"] - 1]
    now = env.market.close[info["bar"]]

    assert obs[-2] == 1.0
    assert obs[-1] == pytest.approx(now / entry - 1, rel=1e-5)


def test_invalid_action_is_refused_with_the_action_meanings() -> None:
    env = TradingEnv(synthetic_bars=3_000, allow_short=False)
    env.reset(seed=0)

    with pytest.raises(
        ValueError, match=r"action 2 is not in Discrete\(2\) \(targets: flat, long\)"
    ):
        env.step(2)


def test_too_little_data_says_which_knob_to_turn() -> None:
    with pytest.raises(ValueError, match="lower episode_length or window"):
        TradingEnv(synthetic_bars=600, episode_length=256)


def test_bad_config_values_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="eval_fraction must be strictly between 0 and 1"):
        TradingEnv(eval_fraction=1.0)
    with pytest.raises(ValueError, match="fee_bps must be in"):
        TradingEnv(fee_bps=-1)
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
        TradingEnv(split="test")


def test_bad_data_file_error_reaches_the_caller_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("timestamp,open,high,low,close,volume\n1,1,1,1,1,1\n2,1,0.5,0.9,1,1\n")

    with pytest.raises(ValueError, match=r"bad\.csv:3: high 0\.5 is below low 0\.9"):
        gym.make(ENV_ID, data=str(path))


def test_synthetic_market_is_announced_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    # An unusual size, so the per-process market cache cannot answer without loading.
    with caplog.at_level("WARNING", logger="fedrl.envs.market_source"):
        TradingEnv(synthetic_bars=3_001)

    assert "SYNTHETIC" in caplog.text and "not real prices" in caplog.text


def test_without_costs_equity_follows_a_plain_units_and_cash_account() -> None:
    env = TradingEnv(synthetic_bars=3_000, fee_bps=0, slippage_bps=0, episode_length=200)
    _, info = env.reset(seed=3)
    close = env.market.close
    actions = np.random.default_rng(3).integers(0, 3, 200)

    cash, units, position, total_reward = 1.0, 0.0, 0, 0.0
    for action in actions:
        bar = info["bar"]
        target = int(action) - 1  # short, flat, long
        if target != position:
            equity = cash + units * close[bar]
            units = target * equity / close[bar]
            cash = equity - units * close[bar]
            position = target
        _, reward, terminated, truncated, info = env.step(int(action))
        total_reward += reward
        assert info["equity"] == pytest.approx(cash + units * close[bar + 1], rel=1e-9)
        assert not terminated
        if truncated:
            break

    assert total_reward == pytest.approx(math.log(info["equity"]), rel=1e-9)
