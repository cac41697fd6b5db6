"""What one invocation of the population bench runs: the task, the arms, the budgets, the commands.

Per seed, N sets of the searched hyperparameters are drawn from their ranges
(fedrl.common.hyperparameters: log-uniform learning rate, replay ratio and
target period, uniform n-step and ε base, γ log-uniform in its horizon) for
the largest population size N. Every arm starts from those same sets:

- `independent n`: the first n sets, each an `fedrl-client --offline` run;
  the runs of the largest size are run once and their first n are the
  smaller arm's (independent runs do not interact, so n of them are n runs);
- `population n`: the first n sets as members of one population session of
  a local `fedrl-server`, each an `fedrl-client --mode pbt` run;
- `default`: one `--offline` run with the client's default hyperparameters.

Member i of a seed has env seed 100·seed + i in every arm, and every run has
the same env-step budget: a population and its independent runs spend the
same env steps. Each run is evaluated greedily by the client itself
(--eval-interval, --eval-episodes) in serial mode (--workers 0): one process,
one core's worth of CPU, each.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path

from fedrl.common.hyperparameters import SEARCH_SPACE, SEARCHED

CLI = [sys.executable, "-c", "from fedrl.client.commands.cli import main; main()"]
FLAGS = {
    "dqn": {
        "lr": "--lr",
        "replay_ratio": "--replay-ratio",
        "n_step": "--n-step",
        "target_update_interval": "--target-update-interval",
        "gamma": "--gamma",
        "exploration_base": "--exploration-base",
    },
    "ppo": {
        "lr": "--ppo-lr",
        "entropy_coef": "--entropy-coef",
        "clip_range": "--clip-range",
        "gae_lambda": "--gae-lambda",
    },
}
"""The command-line option of each searched hyperparameter, by algorithm."""
WHOLE = frozenset({"n_step", "target_update_interval"})


@dataclass(frozen=True)
class Task:
    """An environment, the return that counts as solved, and the budgets that suit it."""

    env: str
    target: float
    steps: int
    """Env steps per run (per member)."""
    eval_interval: int
    ready_steps: int
    """The server's --pbt-ready-steps."""


TASKS = {
    "CartPole-v1": Task("CartPole-v1", 475.0, 30_000, 2_000, 6_000),
    # Gymnasium's own threshold for LunarLander: 200.
    "LunarLander-v3": Task("LunarLander-v3", 200.0, 300_000, 10_000, 40_000),
}


@dataclass(frozen=True)
class Settings:
    """One invocation's settings (bench.population.cli's options)."""

    task: Task
    seeds: tuple[int, ...]
    sizes: tuple[int, ...]
    algo: str = "dqn"
    eval_episodes: int = 10
    score_window: int = 3
    jobs: int = 2
    network: tuple[str, ...] = ()
    """Options every run gets beside the client's defaults (e.g. ("--hidden", "64,64"))."""

    @property
    def largest(self) -> int:
        return max(self.sizes)


def sampled(seed: int, count: int, algo: str) -> list[dict[str, float]]:
    """`count` sets of `algo`'s searched hyperparameters, drawn from their ranges."""
    rng = random.Random(seed)
    return [
        {name: SEARCH_SPACE[name].resample(rng) for name in SEARCHED[algo]} for _ in range(count)
    ]


def member_seed(seed: int, index: int) -> int:
    return 100 * seed + index


def client_command(
    name: str,
    values: dict[str, float] | None,
    *,
    seed: int,
    settings: Settings,
    state: Path,
    extra: list[str],
) -> list[str]:
    """A `fedrl-client` run of `name` with `values` (None: the defaults)."""
    task = settings.task
    command = [
        *CLI,
        "--participant-id", name,
        "--state-dir", str(state),
        "--algo", settings.algo,
        "--env", task.env,
        "--workers", "0",
        "--seed", str(seed),
        "--episodes", "1000000000",
        "--max-env-steps", str(task.steps),
        "--eval-interval", str(task.eval_interval),
        "--eval-episodes", str(settings.eval_episodes),
        "--log-interval", "3600",
        *settings.network,
        *extra,
    ]  # fmt: skip
    for key, value in (values or {}).items():
        text = str(round(value)) if key in WHOLE else repr(value)
        command += [FLAGS[settings.algo][key], text]
    return command


def server_options(settings: Settings) -> list[str]:
    """The population server's options: the product's defaults but for these."""
    return [
        *("--pbt-ready-steps", str(settings.task.ready_steps)),
        *("--pbt-score-window", str(settings.score_window)),
        # The runs end by their env-step budget, not by the session's goal.
        *("--goal-episodes", "1000000000"),
        # Benchmarks measure training, not the page.
        "--no-dashboard",
    ]
