"""`fedrl-client backtest`: a greedy policy over the evaluation split, next to buy-and-hold.

Reads top to bottom: metrics (pure numpy), the runner, the text report, the equity-curve PNG,
the model loader, the click command. Buy-and-hold runs through the same environment with
"always long", so it pays the same entry costs and is marked on the same bars.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch
from gymnasium.envs.registration import load_env_creator

from fedrl.client.training.architecture import (
    ArchitectureError,
    build_from_tensors,
    infer_architecture,
)
from fedrl.client.training.obs_window import ObservationWindow
from fedrl.client.training.policy_network import ActorCritic
from fedrl.client.training.vector_env import EnvShape
from fedrl.common.config_cli import doc, section, takes_config
from fedrl.common.config_help import ConfigCommand

# Importing any fedrl.envs module registers fedrl/Trading-v0 with Gymnasium.
from fedrl.envs.trading import ENV_ID, TradingEnv
from fedrl.envs.trading_config import TradingConfig

Policy = Callable[[npt.NDArray[np.float32]], npt.NDArray[np.integer[Any]]]
"""Greedy policy: observations (B, *obs_shape) float32 to actions (B,) ints."""


@dataclass(frozen=True)
class WindowedPolicy:
    """A policy that decides on each env's window of its last `context` observations."""

    act: Policy
    """Windows (B, context, features + 1) to actions (B,)."""
    context: int


PolicyLoader = Callable[[Path, tuple[int, ...], int], Policy | WindowedPolicy]
"""(model path, observation shape, action count) to a policy."""

_NS_PER_YEAR = 365.25 * 24 * 3600 * 1e9

# --- Metrics ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    """How one strategy did over the backtest's bars."""

    total_return: float
    """Final over initial equity, minus one."""
    sharpe: float
    """Mean over standard deviation of per-bar returns, times sqrt(bars per year); 0 if flat."""
    max_drawdown: float
    """Largest fall from a running peak, as a fraction of the peak (0.25 = 25 % down)."""
    trades: int
    """Position changes, a reversal counting once."""
    exposure: float
    """Share of bars spent holding a position."""


def bars_per_year(time_ns: npt.NDArray[np.int64]) -> float:
    """Bars per year the timestamps imply: weekends and holidays count, as in the data."""
    span = float(time_ns[-1] - time_ns[0])
    if len(time_ns) < 2 or span <= 0:
        raise ValueError("need at least two bars at distinct times to annualise")
    return (len(time_ns) - 1) / (span / _NS_PER_YEAR)


def compute_metrics(
    equity: npt.NDArray[np.float64], positions: npt.NDArray[np.integer[Any]], per_year: float
) -> Metrics:
    """`equity` at each bar (first one the start), `positions` held over each bar after it."""
    if len(equity) != len(positions) + 1 or len(positions) == 0:
        raise ValueError(
            f"need equity at n+1 bars for n >= 1 positions, got {len(equity)} and {len(positions)}"
        )
    returns = equity[1:] / equity[:-1] - 1
    spread = float(returns.std(ddof=1)) if len(returns) > 1 else 0.0
    sharpe = float(returns.mean()) / spread * math.sqrt(per_year) if spread > 0 else 0.0
    peaks = np.maximum.accumulate(equity)
    return Metrics(
        total_return=float(equity[-1] / equity[0] - 1),
        sharpe=sharpe,
        max_drawdown=float(np.max(1 - equity / peaks)),
        trades=int(np.count_nonzero(np.diff(positions, prepend=0))),
        exposure=float(np.mean(positions != 0)),
    )


# --- Runner -------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Curve:
    """One strategy's path through the backtest."""

    equity: npt.NDArray[np.float64]
    positions: npt.NDArray[np.int8]
    metrics: Metrics


@dataclass(frozen=True, eq=False)
class BacktestResult:
    """The policy and buy-and-hold over the same evaluation bars."""

    source: str
    time_ns: npt.NDArray[np.int64]
    bars_per_year: float
    policy: Curve
    buy_and_hold: Curve


def run_backtest(policy: Policy | WindowedPolicy, config: TradingConfig) -> BacktestResult:
    """Step `config`'s evaluation split once, start to end, with `policy` and with buy-and-hold."""
    env = TradingEnv(dataclasses.replace(config, split="eval", episode_length=None))
    n_actions = env.n_actions
    # The last action is always "long", with or without shorts.
    time_ns, ours = _walk(env, policy)
    _, held = _walk(env, lambda obs: np.full(len(obs), n_actions - 1))
    per_year = bars_per_year(time_ns)
    return BacktestResult(
        source=env.market.bars.source,
        time_ns=time_ns,
        bars_per_year=per_year,
        policy=_curve(ours, per_year),
        buy_and_hold=_curve(held, per_year),
    )


def _walk(
    env: TradingEnv, policy: Policy | WindowedPolicy
) -> tuple[npt.NDArray[np.int64], tuple[list[float], list[int]]]:
    obs, info = env.reset(seed=0)
    window = (
        ObservationWindow(1, env.obs_shape, policy.context)
        if isinstance(policy, WindowedPolicy)
        else None
    )
    seen = window.reset(obs[None]) if window is not None else obs[None]
    act = policy.act if isinstance(policy, WindowedPolicy) else policy
    times, equity, positions = [info["time_ns"]], [info["equity"]], []
    done = False
    while not done:
        chosen = np.asarray(act(seen))
        if chosen.shape != (1,) or chosen.dtype.kind not in "iu":
            raise ValueError(
                f"the policy must return one integer action per observation, got shape "
                f"{chosen.shape} of {chosen.dtype}"
            )
        obs, _, terminated, truncated, info = env.step(int(chosen[0]))
        seen = (
            window.push(obs[None], starts=np.zeros(1, dtype=np.bool_))
            if window is not None
            else obs[None]
        )
        times.append(info["time_ns"])
        equity.append(info["equity"])
        positions.append(info["position"])
        done = terminated or truncated
    return np.array(times, dtype=np.int64), (equity, positions)


def _curve(path: tuple[list[float], list[int]], per_year: float) -> Curve:
    equity = np.array(path[0])
    positions = np.array(path[1], dtype=np.int8)
    return Curve(equity, positions, compute_metrics(equity, positions, per_year))


# --- Report -------------------------------------------------------------------------------


def format_report(result: BacktestResult) -> str:
    """The two strategies' metrics side by side, as plain text."""
    start, end = (
        np.datetime64(int(t), "ns").astype("datetime64[m]") for t in result.time_ns[[0, -1]]
    )
    ours, held = result.policy.metrics, result.buy_and_hold.metrics
    rows = [
        ("total return", f"{ours.total_return:+.2%}", f"{held.total_return:+.2%}"),
        ("annualised Sharpe", f"{ours.sharpe:.2f}", f"{held.sharpe:.2f}"),
        ("max drawdown", f"{-ours.max_drawdown:.2%}", f"{-held.max_drawdown:.2%}"),
        ("trades", f"{ours.trades}", f"{held.trades}"),
        ("exposure", f"{ours.exposure:.1%}", f"{held.exposure:.1%}"),
    ]
    lines = [
        f"Backtest on {result.source}, evaluation split",
        f"{start} to {end} UTC: {len(result.time_ns) - 1} bars, "
        f"{result.bars_per_year:,.0f} bars/year",
        "",
        f"{'':<20}{'policy':>12}{'buy & hold':>12}",
        *(f"{name:<20}{a:>12}{b:>12}" for name, a, b in rows),
    ]
    return "\n".join(lines)


# --- Equity-curve PNG ---------------------------------------------------------------------


def write_equity_png(result: BacktestResult, path: Path) -> None:
    """Both equity curves over time, as a PNG; needs matplotlib (the `plot` extra)."""
    try:
        # Optional (the `plot` extra). The object API, not pyplot: no global figure state and
        # no GUI backend to pick on a headless machine.
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as err:
        raise RuntimeError(
            "writing the equity curve needs matplotlib: pip install 'fedrl[plot]'"
        ) from err
    times = result.time_ns.astype("datetime64[ns]")
    figure = Figure(figsize=(10, 4.5), layout="constrained")
    axes = figure.add_subplot()
    axes.plot(times, result.policy.equity, label="policy", linewidth=1.2)
    axes.plot(times, result.buy_and_hold.equity, label="buy & hold", linewidth=1.0, alpha=0.8)
    axes.set_title(f"Equity, evaluation split of {result.source}")
    axes.set_ylabel("equity (start = 1)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)


# --- Model ----------------------------------------------------------------------------------


def load_policy(
    model_path: Path, obs_shape: tuple[int, ...], n_actions: int
) -> Policy | WindowedPolicy:
    """The greedy policy of a saved model (a torch.save'd dict, loaded without pickle).

    Accepts a client state dir's model file ({"tensors": {name: tensor}, ...}), a
    learner state (DQN's {"online": ...}, PPO's {"net": ...}), {"model": state_dict},
    or a bare state_dict. A DQN acts on the argmax of its Q-values, a PPO policy on
    its most probable action; the network's kind and sizes are read off the tensors
    (fedrl.client.training.architecture), so a model trained with any settings loads
    without being told them. A transformer's policy decides on observation windows.
    """
    try:
        saved = torch.load(model_path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a bad file; all mean the same
        raise ValueError(f"{model_path}: not a model saved by fedrl ({err})") from err
    weights = _state_dict_of(saved)
    if weights is None:
        raise ValueError(
            f"{model_path}: expected a dict of tensors, or one under "
            f"{' or '.join(repr(k) for k in _WEIGHT_KEYS)}"
        )
    tensors = [(name, t.detach().numpy()) for name, t in weights.items()]
    try:
        arch = infer_architecture(tensors)
        network = build_from_tensors(
            tensors,
            arch.input_shape(obs_shape),
            EnvShape(obs_shape=arch.input_shape(obs_shape), n_actions=n_actions),
        )
    except ArchitectureError as err:
        raise ValueError(
            f"{model_path}: the model does not fit this environment's observation "
            f"{obs_shape} and {n_actions} actions: {err}"
        ) from err

    def greedy(obs: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]:
        with torch.no_grad():
            batch = torch.as_tensor(obs, dtype=torch.float32)
            if isinstance(network, ActorCritic):
                action = network.greedy(batch)
            else:
                action = network(batch).argmax(dim=1)
        return np.asarray(action.numpy(), dtype=np.int64)

    return WindowedPolicy(greedy, arch.window) if arch.window else greedy


# Where the weights sit: a client state dir's model.pt and best.pt ("tensors"), a learner
# state ("online" for DQN, "net" for PPO), or a hand-saved {"model": ...}.
_WEIGHT_KEYS = ("tensors", "online", "net", "model")


def _state_dict_of(saved: object) -> dict[str, Any] | None:
    if isinstance(saved, dict):
        for key in _WEIGHT_KEYS:
            if isinstance(saved.get(key), dict):
                return _state_dict_of(saved[key])
        if saved and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in saved.items()
        ):
            return saved
    return None


# --- Command --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BacktestConfig:
    """The backtest command: which model, on which environment, and where the curve goes."""

    model_path: Path = field(
        metadata=doc(
            "Saved model (.pt: a DQN or PPO policy) to run greedily.",
            flag="--model",
            path="file",
            exists=True,
        ),
    )
    env_id: str = field(default=ENV_ID, metadata=doc("Trading env id.", flag="--env"))
    out: Path = field(
        default=Path("equity.png"),
        metadata=doc("Where to write the equity-curve PNG.", path="file"),
    )
    trading: TradingConfig = field(
        default_factory=TradingConfig,
        # A backtest always runs the whole evaluation split once; every other env knob is an
        # option, so the command and the environment cannot drift apart.
        metadata=section("The trading environment.", omit=("split", "episode_length")),
    )


def make_backtest_command(loader: PolicyLoader = load_policy) -> click.Command:
    """The `backtest` command; `loader` turns --model into a policy (tests pass their own)."""

    @click.command("backtest", cls=ConfigCommand)
    @takes_config(BacktestConfig)
    def backtest(config: BacktestConfig) -> None:
        """Run a saved model greedily over the evaluation split; compare with buy-and-hold."""
        _check_trading_env(config.env_id)
        try:
            env = dataclasses.replace(config.trading, split="eval", episode_length=None)
            probe = TradingEnv(env)
            policy = loader(config.model_path, probe.obs_shape, probe.n_actions)
            result = run_backtest(policy, env)
        except ValueError as err:  # MarketDataError included: the message names file and line
            raise click.ClickException(str(err)) from err
        click.echo(format_report(result))
        try:
            write_equity_png(result, config.out)
        except RuntimeError as err:
            raise click.ClickException(str(err)) from err
        click.echo(f"\nequity curve: {config.out}")

    return backtest


def _check_trading_env(env_id: str) -> None:
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as err:
        raise click.BadParameter(f"unknown env id {env_id!r}", param_hint="--env") from err
    entry = spec.entry_point
    creator = entry if callable(entry) or entry is None else load_env_creator(entry)
    if not (isinstance(creator, type) and issubclass(creator, TradingEnv)):
        raise click.BadParameter(
            f"{env_id!r} is not a trading environment; backtests need {ENV_ID}",
            param_hint="--env",
        )


backtest = make_backtest_command()
