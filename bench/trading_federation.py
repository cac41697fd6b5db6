"""Two traders with different symbols in one session against each alone, on both symbols.

Participant A holds bars of AAA only, participant B of BBB only (different synthetic
markets, as two brokers' data would be). Each trains alone (`--offline`) and, with the same
env-step budget each, the two train together in one session of a real `fedrl-server` on
loopback (the client's defaults: weights and experience shared). Every final model is then
backtested greedily on the evaluation split of both symbols (`fedrl-client backtest`'s
runner), beside buy-and-hold: does the group's model trade both markets better than a model
that saw one? The model spec does not depend on the symbols, so the two may join one session.

    .venv/bin/python bench/trading_federation.py [--quick] [--steps 20000] [--seeds 0 1]

Every participant runs with `--workers 0` (its actor in its learner's process), so a pair
fits a 2-core machine. The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fedrl.client.commands.backtest import load_policy, run_backtest
from fedrl.envs.bars import MarketData
from fedrl.envs.columnar_bars import write_market
from fedrl.envs.synthetic import synthetic_bars
from fedrl.envs.trading import TradingEnv
from fedrl.envs.trading_config import TradingConfig
from fedrl.server.launcher import ServerProcess

CLIENT = [sys.executable, "-c", "from fedrl.client.commands.cli import main; main()"]
SYMBOLS = {"A": ("AAA", 101), "B": ("BBB", 202)}
"""Participant: (its symbol, the seed of that symbol's synthetic market)."""
BARS = 12_000


def write_markets(folder: Path) -> dict[str, Path]:
    """One file per participant, and one of both symbols for the backtest."""
    series = {}
    for who, (symbol, seed) in SYMBOLS.items():
        bars = synthetic_bars(BARS, seed)
        series[who] = dataclasses.replace(bars, symbol=symbol, source=symbol)
    paths = {}
    for who, bars in series.items():
        paths[who] = folder / f"{who}.parquet"
        write_market(MarketData(series=(bars,), source=bars.symbol), paths[who])
    paths["both"] = folder / "both.parquet"
    write_market(MarketData(series=tuple(series.values()), source="AAA and BBB"), paths["both"])
    return paths


def client(state: Path, who: str, data: Path, steps: int, seed: int, *extra: str) -> list[str]:
    return [
        *CLIENT, "--participant-id", who, "--state-dir", str(state), "--env", "fedrl/Trading-v0",
        "--data", str(data), "--workers", "0", "--max-env-steps", str(steps),
        "--episodes", "1000000", "--seed", str(seed), "--eval-interval", "0",
        "--log-interval", "30", *extra,
    ]  # fmt: skip


def run_all(commands: list[list[str]], logs: Path) -> None:
    """Start every command at once and wait for all; a failure stops the bench with its log."""
    running = []
    for i, command in enumerate(commands):
        log = (logs / f"run-{i}.log").open("w")
        running.append((subprocess.Popen(command, stdout=log, stderr=log), log.name))
    for process, log_name in running:
        if process.wait() != 0:
            raise SystemExit(f"a participant failed; see {log_name}:\n{Path(log_name).read_text()}")


def backtest(model: Path, both: Path) -> dict[str, float]:
    config = TradingConfig(data=str(both))
    probe = TradingEnv(config)
    result = run_backtest(load_policy(model, probe.obs_shape, probe.n_actions), config)
    figures = {f"{run.symbol}_return": run.policy.metrics.total_return for run in result.symbols}
    figures["total_return"] = result.policy.metrics.total_return
    figures["total_sharpe"] = result.policy.metrics.sharpe
    figures["hold_total_return"] = result.buy_and_hold.metrics.total_return
    for run in result.symbols:
        figures[f"hold_{run.symbol}_return"] = run.buy_and_hold.metrics.total_return
    return figures


def one_seed(folder: Path, paths: dict[str, Path], steps: int, seed: int) -> dict[str, object]:
    lone, group = folder / f"lone-{seed}", folder / f"group-{seed}"
    start = time.perf_counter()
    run_all(
        [client(lone, who, paths[who], steps, seed, "--offline") for who in SYMBOLS],
        folder,
    )
    lone_s = time.perf_counter() - start
    server = ServerProcess(folder / f"server-{seed}", "--goal-episodes", "1000000000")
    server.start()
    joined = ("--server", server.address, "--session", "trading", "--insecure")
    try:
        start = time.perf_counter()
        run_all(
            [client(group, who, paths[who], steps, seed, *joined) for who in SYMBOLS],
            folder,
        )
        group_s = time.perf_counter() - start
    finally:
        server.stop(30)
    models = {f"alone on {SYMBOLS[who][0]}": lone / who / "model.pt" for who in SYMBOLS}
    models |= {f"group member {who}": group / who / "model.pt" for who in SYMBOLS}
    return {
        "seed": seed,
        "wall_s": {"lone_pair": lone_s, "group": group_s},
        "backtest": {name: backtest(path, paths["both"]) for name, path in models.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3,000 env steps, one seed")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per participant")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    steps, seeds = (3_000, [0]) if args.quick else (args.steps, args.seeds)

    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        paths = write_markets(folder)
        runs = [one_seed(folder, paths, steps, seed) for seed in seeds]

    names = list(runs[0]["backtest"])  # type: ignore[call-overload]
    print(f"{steps:,} env steps per participant, seeds {seeds}; evaluation split of both symbols")
    print(f"{'model':<18}{'AAA':>9}{'BBB':>9}{'total':>9}{'Sharpe':>8}   (median over seeds)")
    medians: dict[str, dict[str, float]] = {}
    for model in names:
        keys = runs[0]["backtest"][model].keys()  # type: ignore[index]
        medians[model] = {
            k: float(np.median([r["backtest"][model][k] for r in runs]))
            for k in keys  # type: ignore[index]
        }
        m = medians[model]
        print(
            f"{model:<18}{m['AAA_return']:>+9.1%}{m['BBB_return']:>+9.1%}"
            f"{m['total_return']:>+9.1%}{m['total_sharpe']:>8.2f}"
        )
    m = medians[names[0]]
    print(
        f"{'buy & hold':<18}{m['hold_AAA_return']:>+9.1%}{m['hold_BBB_return']:>+9.1%}"
        f"{m['hold_total_return']:>+9.1%}"
    )
    print(json.dumps({"bench": "trading_federation", "steps": steps, "runs": runs}))


if __name__ == "__main__":
    main()
