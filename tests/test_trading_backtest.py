"""Backtest: metrics against hand-computed values, runner, report, PNG, model loading, command."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

from fedrl.client.commands.backtest import (
    Policy,
    bars_per_year,
    compute_metrics,
    format_report,
    load_policy,
    make_backtest_command,
    run_backtest,
)
from fedrl.client.training.q_network import build_q_network
from fedrl.common.config_help import FieldOption
from fedrl.envs.market_source import MarketSource
from fedrl.envs.trading import TradingEnv
from fedrl.envs.trading_config import TradingConfig

CONFIG = TradingConfig(synthetic_bars=3_000, window=8)
HOUR_NS = 3_600 * 10**9


def constant(action: int) -> Policy:
    return lambda obs: np.full(len(obs), action)


def test_metrics_match_hand_computed_values() -> None:
    equity = np.array([1.0, 1.1, 0.99, 0.99, 1.089])
    positions = np.array([1, 1, 0, -1])

    metrics = compute_metrics(equity, positions, per_year=4.0)

    returns = [0.1, -0.1, 0.0, 0.1]
    mean = sum(returns) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / 3)
    assert metrics.total_return == pytest.approx(0.089)
    assert metrics.sharpe == pytest.approx(mean / std * 2.0)
    assert metrics.max_drawdown == pytest.approx(0.1)
    assert metrics.trades == 3  # flat->long, long->flat, flat->short
    assert metrics.exposure == pytest.approx(0.75)


def test_flat_equity_has_zero_sharpe_and_no_drawdown() -> None:
    metrics = compute_metrics(np.ones(5), np.zeros(4, dtype=np.int8), per_year=8766.0)

    assert (metrics.total_return, metrics.sharpe, metrics.max_drawdown) == (0.0, 0.0, 0.0)
    assert (metrics.trades, metrics.exposure) == (0, 0.0)


def test_bars_per_year_comes_from_the_timestamps() -> None:
    hourly = np.arange(1_000, dtype=np.int64) * HOUR_NS
    # Daily bars on weekdays only: five bars every seven days.
    weekdays = np.array([d for d in range(700) if d % 7 < 5], dtype=np.int64) * 24 * HOUR_NS

    assert bars_per_year(hourly) == pytest.approx(365.25 * 24)
    assert bars_per_year(weekdays) == pytest.approx(365.25 * 5 / 7, rel=0.01)


def test_always_long_policy_is_exactly_buy_and_hold() -> None:
    result = run_backtest(constant(2), CONFIG)

    np.testing.assert_array_equal(result.policy.equity, result.buy_and_hold.equity)
    assert result.buy_and_hold.metrics.trades == 1
    assert result.buy_and_hold.metrics.exposure == 1.0


def test_backtest_covers_the_whole_evaluation_split_once() -> None:
    result = run_backtest(constant(1), CONFIG)

    (split_at,) = TradingEnv(CONFIG).market.split_at
    assert len(result.time_ns) == 3_000 - split_at
    assert result.time_ns[0] == TradingEnv(CONFIG).market.time_ns[split_at]
    assert result.policy.metrics.total_return == 0.0
    assert result.policy.metrics.trades == 0


def test_buy_and_hold_pays_entry_costs_and_follows_the_price() -> None:
    result = run_backtest(constant(1), CONFIG)
    market = TradingEnv(CONFIG).market
    closes = market.close[np.searchsorted(market.time_ns, result.time_ns)]

    # Entry at the first close plus 5 bps slippage, and a 10 bps fee.
    expected = closes / (closes[0] * 1.0005 * 1.001)
    expected[0] = 1.0  # marked before the entry

    np.testing.assert_allclose(result.buy_and_hold.equity, expected, rtol=1e-12)


def test_report_puts_policy_and_buy_and_hold_side_by_side() -> None:
    result = run_backtest(constant(0), CONFIG)

    report = format_report(result)

    assert "policy" in report and "buy & hold" in report
    for name in ("total return", "annualised Sharpe", "max drawdown", "trades", "exposure"):
        assert name in report
    assert "synthetic" in report and "8,766 bars/year" in report


def save_network(
    path: Path, obs_size: int, n_actions: int, hidden: tuple[int, ...]
) -> torch.nn.Module:
    """A model file as the client's state dir writes it: named tensors and metadata."""
    torch.manual_seed(0)
    network: torch.nn.Module = build_q_network((obs_size,), n_actions, hidden=hidden, dueling=True)
    tensors = {name: param.detach() for name, param in network.named_parameters()}
    torch.save({"format": 1, "env": "fedrl/Trading-v0", "tensors": tensors}, path)
    return network


def test_load_policy_reads_a_learner_state_too(tmp_path: Path) -> None:
    torch.manual_seed(1)
    network = build_q_network((10,), 2, hidden=(4,), dueling=False)
    torch.save({"online": network.state_dict(), "updates": 3}, tmp_path / "learner.pt")
    obs = np.random.default_rng(1).standard_normal((8, 10)).astype(np.float32)

    policy = load_policy(tmp_path / "learner.pt", (10,), 2)

    with torch.no_grad():
        expected = network(torch.from_numpy(obs)).argmax(dim=1).numpy()
    np.testing.assert_array_equal(policy(obs), expected)


def test_load_policy_acts_greedily_with_the_saved_network(tmp_path: Path) -> None:
    network = save_network(tmp_path / "model.pt", 50, 3, hidden=(32, 16))
    obs = np.random.default_rng(0).standard_normal((20, 50)).astype(np.float32)

    policy = load_policy(tmp_path / "model.pt", (50,), 3)

    with torch.no_grad():
        expected = network(torch.from_numpy(obs)).argmax(dim=1).numpy()
    np.testing.assert_array_equal(policy(obs), expected)


def test_load_policy_refuses_a_model_for_another_env(tmp_path: Path) -> None:
    save_network(tmp_path / "model.pt", 50, 3, hidden=(8,))

    with pytest.raises(ValueError, match=r"does not fit this environment's observation \(26,\)"):
        load_policy(tmp_path / "model.pt", (26,), 3)


def test_load_policy_refuses_files_that_are_not_models(tmp_path: Path) -> None:
    (tmp_path / "notes.pt").write_text("hello")
    torch.save([1, 2, 3], tmp_path / "list.pt")

    with pytest.raises(ValueError, match=r"notes\.pt: not a model saved by fedrl"):
        load_policy(tmp_path / "notes.pt", (4,), 2)
    with pytest.raises(ValueError, match=r"list\.pt: expected a dict of tensors"):
        load_policy(tmp_path / "list.pt", (4,), 2)


def run_command(
    tmp_path: Path, *args: str, policy_action: int = 2
) -> tuple[Result, list[tuple[tuple[int, ...], int]]]:
    model = tmp_path / "model.pt"
    model.write_bytes(b"unused: the loader below ignores it")
    seen: list[tuple[tuple[int, ...], int]] = []

    def loader(path: Path, obs_shape: tuple[int, ...], n_actions: int) -> Policy:
        seen.append((obs_shape, n_actions))
        return constant(policy_action)

    command = make_backtest_command(loader)
    result = CliRunner().invoke(command, ["--model", str(model), *args])
    return result, seen


def test_command_prints_the_report_and_writes_the_png(tmp_path: Path) -> None:
    out = tmp_path / "curve.png"

    result, seen = run_command(
        tmp_path,
        "--out",
        str(out),
        "--synthetic-bars",
        "3000",
        "--window",
        "8",
        "--no-allow-short",
        policy_action=1,
    )

    assert result.exit_code == 0, result.output
    assert seen == [((8 * 6 + 2,), 2)]
    assert "total return" in result.output and "buy & hold" in result.output
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_command_reports_a_bad_data_file_by_line_without_a_traceback(tmp_path: Path) -> None:
    data = tmp_path / "bars.csv"
    data.write_text("timestamp,open,high,low,close,volume\n1,1,1,1,1,1\n2,1,x,1,1,1\n")

    result, _ = run_command(tmp_path, "--data", str(data))

    assert result.exit_code == 1
    assert f"{data}:3: non-numeric value 'x' in column 'high'" in result.output
    assert "Traceback" not in result.output


def test_command_refuses_a_non_trading_env(tmp_path: Path) -> None:
    result, _ = run_command(tmp_path, "--env", "CartPole-v1")

    assert result.exit_code == 2
    assert "'CartPole-v1' is not a trading environment" in result.output


def test_command_env_options_match_the_config_fields() -> None:
    command = make_backtest_command()
    fields_of_command = {p.name for p in command.params if isinstance(p, FieldOption)}
    options = fields_of_command - {"model_path", "env_id", "out"}
    fields = {f.name for f in dataclasses.fields(TradingConfig)} - {"source"}
    source_fields = {f.name for f in dataclasses.fields(MarketSource)}

    # A backtest always runs the whole evaluation split once.
    assert options == (fields | source_fields) - {"split", "episode_length"}
    defaults = {p.name: p.default for p in command.params if p.name in options}
    expected = {name: getattr(TradingConfig(), name) for name in options - source_fields}
    expected |= {name: getattr(MarketSource(), name) for name in source_fields}
    assert defaults == expected
