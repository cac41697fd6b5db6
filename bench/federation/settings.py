"""What one invocation runs: the tasks, the settings every run shares, and the configurations."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.sync_loop import Share
from fedrl.client.federation.sync_plan import SyncPlan, sync_plan
from fedrl.client.training.learner_config import LearnerConfig, TargetAtAdoption

Mode = Literal["offline", "weights", "experience", "both", "roles", "pooled"]
"""What a run does: a lone learner ("offline"), a group sharing something, or one learner with
a whole group's envs ("pooled")."""
Algorithm = Literal["dqn", "ppo"]
GROUP_MODES: tuple[Mode, ...] = ("weights", "experience", "both", "roles")
"""What a group may share (--modes); the lone and pooled references run beside every one."""
SHARE: dict[Mode, Share] = {
    "weights": "weights",
    "experience": "experience",
    "both": "both",
    "roles": "both",
}
"""What each group mode has the client share (SyncLoop's `share`, the client's --share)."""
LOCAL_MODEL_MODES: tuple[Mode, ...] = ("offline", "experience", "pooled")
"""Modes with no global model to score: participant 0's own weights are scored instead."""
SERVERLESS_MODES: tuple[Mode, ...] = ("offline", "pooled")
"""Modes that run no server: their one learner starts from version 0 itself."""
PPO_MODES: tuple[Mode, ...] = ("weights",)
"""PPO learns from its own rollouts: it shares weights only and has no acting-only role."""
MODE_NAMES: dict[Mode, str] = {
    "offline": "lone learner (no server)",
    "weights": "weights (global model)",
    "experience": "experience (p0's own model)",
    "both": "weights + experience (global model)",
    "roles": "p0 learns, the others act (global model)",
    "pooled": "pooled: one learner, N x envs and steps",
}
SESSION = "default"
CLIENT = TrainConfig()
EXCHANGE = ExchangeConfig()


@dataclass(frozen=True)
class Task:
    """An environment, the score that counts as solved, the run's length and its seeds."""

    env: str
    target: float
    budget_steps: int
    """Env steps each participant takes."""
    eval_every: int
    """Per-participant env steps between marks."""
    seeds: int
    """Run seeds by default (0 to seeds - 1): enough for a 95 % interval to say something."""


TASKS: dict[str, Task] = {
    # Gymnasium's threshold for solved.
    "cartpole": Task("CartPole-v1", target=475.0, budget_steps=12_000, eval_every=250, seeds=10),
    # Gymnasium counts 200 as solved; 100 is a target a lone learner reaches within the
    # budget on most seeds (docs/federation-benchmark.md, "Budgets").
    "lunarlander": Task(
        "LunarLander-v3", target=100.0, budget_steps=120_000, eval_every=4_000, seeds=5
    ),
}
QUICK = replace(TASKS["cartpole"], budget_steps=4_000, eval_every=500, seeds=2)
"""--quick: a smoke run that shows every figure, not one that solves CartPole."""


@dataclass(frozen=True)
class Settings:
    """What every run of one bench invocation shares."""

    env: str = TASKS["cartpole"].env
    """Gymnasium env id of the task."""
    target: float = TASKS["cartpole"].target
    """Score (greedy mean return) that counts as solved."""
    budget_steps: int = TASKS["cartpole"].budget_steps
    """Env steps each participant takes; the run ends when all have."""
    eval_every: int = TASKS["cartpole"].eval_every
    """Per-participant env steps between marks."""
    eval_episodes: int = 20
    """Greedy episodes per score, played at once."""
    envs_per_participant: int = 16
    """Envs each participant's serial actor steps as one batch (the engine's default)."""
    hidden: tuple[int, ...] = (256, 256)
    """Q-network hidden widths (the learner's default)."""
    sync_interval: int = CLIENT.sync_interval
    """Local episodes between syncs (the client's default)."""
    sync_steps: int | None = CLIENT.sync_steps
    """Env steps between syncs: a round's length, or asynchronously a bound on top of the
    episodes (None: the client's: 128 in rounds, else 0, episodes only)."""
    round_wait_s: float | None = CLIENT.round_wait_s
    """Synchronous rounds of `sync_steps` when > 0, each waiting at most this long for its
    version; 0: asynchronous; None: the client's default (5 s where rounds can form, from
    `rounds_from` members on); modes that share no weights ignore it."""
    rounds_from: int = CLIENT.rounds_from
    """Members pushing weights from which members sync in rounds (the client's default)."""
    shared_warmup: bool = CLIENT.shared_warmup
    """Rounds until each learner starts, for participants sharing both (the client's default)."""
    delta_dtype: str | None = CLIENT.delta_dtype
    """Wire dtype of weight deltas (None: the client's: float32 in rounds, else bfloat16)."""
    target_at_adoption: TargetAtAdoption = CLIENT.target_at_adoption
    """Target network when a global model is adopted (the client's default, "shift")."""
    foreign_credit: float = EXCHANGE.foreign_credit
    """Replay-ratio credit of a received transition, as a share of a local step's."""
    round_foreign_credit: float = EXCHANGE.round_foreign_credit
    """The same while a participant syncs in rounds (the client's default)."""
    pull_transitions: int = EXCHANGE.pull_transitions
    """Most of the others' transitions a participant pulls per sync (the client's default)."""
    credit_at_own_pace: bool = EXCHANGE.credit_at_own_pace
    """Credit for a sender's transitions up to the receiver's own count (the client's default)."""
    buffer_size: int | None = None
    """Updates per global version (K); None: the server's default (automatic, K = N)."""
    server_lr: float | None = None
    """Server learning rate; None: the server's default."""
    learner: tuple[tuple[str, str], ...] = ()
    """DQN LearnerConfig fields changed from the defaults, as (name, value) text (--learner)."""
    offline_budget_steps: int | None = None
    """Env steps of the lone references; None: `budget_steps`, as everyone's."""
    pooled_over: int = 1
    """Participants whose envs and steps one learner takes ("pooled"); 1 for everyone else."""
    even_pace: bool = False
    """Every participant waits before each round until all the others have taken as many env
    steps: as if each had a machine of its own, all of one speed (`--even-pace`)."""

    @property
    def marks(self) -> list[int]:
        """Per-participant env steps at which every run is scored."""
        return list(range(self.eval_every, self.budget_steps + 1, self.eval_every))

    def sync_plan(self, share: Share, *, on_policy: bool) -> SyncPlan:
        """How a participant sharing `share` syncs, resolved as the client's command resolves
        it; experience-only participants sync asynchronously whatever the settings say."""
        return sync_plan(
            round_wait_s=0.0 if share == "experience" else self.round_wait_s,
            sync_steps=self.sync_steps,
            delta_dtype=self.delta_dtype,
            rounds_from=self.rounds_from,
            sync_interval=self.sync_interval,
            share=share,
            on_policy=on_policy,
            shared_warmup=self.shared_warmup,
        )

    def of(self, mode: Mode) -> Settings:
        """The settings a participant of `mode` runs by: a lone learner's own budget."""
        if mode == "offline" and self.offline_budget_steps is not None:
            return replace(self, budget_steps=self.offline_budget_steps)
        return self

    def pooled(self, n: int) -> Settings:
        """The settings of one learner that collects what n participants would: its marks are
        those of these settings, times n."""
        return replace(
            self,
            envs_per_participant=self.envs_per_participant * n,
            budget_steps=self.budget_steps * n,
            eval_every=self.eval_every * n,
            pooled_over=n,
        )


def settings_from_json(raw: dict[str, Any]) -> Settings:
    """Settings as a participant process receives them: JSON turned the tuples into lists."""
    return Settings(
        **{
            **raw,
            "hidden": tuple(raw["hidden"]),
            "learner": tuple(tuple(pair) for pair in raw["learner"]),
        }
    )


@dataclass(frozen=True)
class Configuration:
    """One arrangement of learners, run once per seed: a group, or a reference beside one."""

    n: int
    """Participants (a pooled learner's: the group whose envs it takes)."""
    mode: Mode
    algo: Algorithm = "dqn"
    replay_ratio: float | None = None
    """The engine's replay ratio; None: its default. The compute-matched references set it."""

    @property
    def key(self) -> str:
        ratio = "" if self.replay_ratio is None else f" rr={self.replay_ratio:.4g}"
        return f"{self.algo} {self.mode} N={self.n}{ratio}"

    @property
    def scores_local_model(self) -> bool:
        return self.mode in LOCAL_MODEL_MODES

    @property
    def processes(self) -> int:
        """Participant processes of a run: N, or one learner for the whole pool."""
        return 1 if self.mode == "pooled" else self.n

    @property
    def pooled_over(self) -> int:
        """Participants whose steps one process takes (N pooled, else 1): its env steps,
        updates, CPU and wall clock are divided by this to be per participant."""
        return self.n if self.mode == "pooled" else 1


RECOMMENDED = Configuration(n=1, mode="both")
"""The client's and server's defaults (N varies): weights and experience, every participant
learning."""


def default_lone(algo: Algorithm) -> Configuration:
    """The lone reference at the engine's defaults."""
    return Configuration(n=1, mode="offline", algo=algo)


def group_configurations(
    ns: Sequence[int], modes: Sequence[Mode], algos: Sequence[Algorithm], *, lone: bool = True
) -> list[Configuration]:
    """Every group mode at every N, N = 1 included unless `lone` is False. Why skip it: a
    repeat of the groups need not repeat the lone member's check, a third of the time of a
    LunarLander pair's seed. The references are chosen per group (bench.federation.sweep)."""
    counts = sorted({1, *ns} if lone else set(ns) - {1})
    return [
        Configuration(n, mode, algo)
        for algo in algos
        for mode in modes
        if algo == "dqn" or mode in PPO_MODES
        for n in counts
    ]


def resolve_task(
    task: Task,
    *,
    env: str | None = None,
    target: float | None = None,
    budget: int | None = None,
    eval_every: int | None = None,
) -> Task:
    """`task`, or the one --env names, with any figure the options give instead."""
    if env is not None and env != task.env:
        by_env = {t.env: t for t in TASKS.values()}
        if env in by_env:
            task = by_env[env]
        elif target is None:
            raise ValueError(f"--target is needed for {env}: the solved threshold is env-specific")
        else:
            task = replace(task, env=env)
    task = replace(
        task,
        target=task.target if target is None else target,
        budget_steps=budget or task.budget_steps,
        eval_every=eval_every or task.eval_every,
    )
    if not 0 < task.eval_every <= task.budget_steps:
        raise ValueError(
            f"--eval-every must be between 1 and the budget ({task.budget_steps:,}), "
            f"got {task.eval_every:,}"
        )
    return task


def learner_overrides(base: LearnerConfig, changes: Sequence[tuple[str, str]]) -> LearnerConfig:
    """base with each named scalar field set from its text; ValueError for anything else."""
    fields = {f.name for f in dataclasses.fields(LearnerConfig)}
    values: dict[str, Any] = {}
    for name, text in changes:
        if name not in fields:
            raise ValueError(f"LearnerConfig has no field {name!r}")
        current = getattr(base, name)
        if isinstance(current, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError(f"{name} takes true or false, got {text!r}")
            values[name] = text.lower() == "true"
        elif isinstance(current, int | float | str):
            try:
                values[name] = type(current)(text)
            except ValueError:
                raise ValueError(f"{name} takes a {type(current).__name__}, got {text!r}") from None
        else:
            raise ValueError(f"{name} is not a number, a flag or a word; set it in code")
    return replace(base, **values)


def name_value(text: str) -> tuple[str, str]:
    """--learner's NAME=VALUE as (name, value), dashes in the name read as underscores."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise ValueError(f"--learner takes NAME=VALUE, got {text!r}")
    return name.replace("-", "_"), value
