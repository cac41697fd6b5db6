"""`TrainConfig`: every knob of the training command, from which its options are made.

One frozen dataclass per command (habit from CleanRL): the options, their
defaults and their help text all come from the fields and their metadata
(fedrl.common.config_cli), so the two cannot drift apart. The engine, the
learner, the networks, PPO, the experience exchange and the connection's
security are sections: their own configs, whose fields are options of this
command too; the command's own fields are in the run, federation and output
sections. The sections head the help and are the tables of a config file
(`--config`). `--algo` picks the learner; the options only the other one reads
are refused (`check_algorithm_options`) rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fedrl.client.federation.channel import ConnectionSecurity
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.sync_loop import Share
from fedrl.client.federation.sync_plan import ROUNDS_FROM, SyncPlan, sync_plan
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig, TargetAtAdoption
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.policy_network import ppo_architecture_name
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.common.config_cli import Section, doc, section
from fedrl.common.config_file import config_to_toml

Role = Literal["learner", "actor"]
"""Whether a participant trains (learner) or only acts for the session's learners (actor)."""
Algorithm = Literal["dqn", "ppo"]
Mode = Literal["federated", "pbt"]

RUN = Section("run", "Who trains, with which server, on what, for how long.")
FEDERATION = Section("federation", "What this participant shares, and when it syncs.")
OUTPUT = Section("output", "State dir, saves, progress lines, TensorBoard.")

PPO_FOLLOWS_LEARNER = ("seed", "device", "amp")
"""PPOConfig fields without options: seeded from the engine's seed stream, the rest the
learner section's (TrainConfig.learner_config)."""


@dataclass(frozen=True)
class TrainConfig:
    """The training command: who trains, how long, where state lives, and the engine and learner."""

    participant_id: str = field(
        default="",
        metadata=doc(
            "Who trains: names the state dir (Unicode allowed). Generated and remembered when "
            "absent (federated runs; --offline needs one).",
            section=RUN,
        ),
    )
    server: str = field(
        default="localhost:7443", metadata=doc("Aggregation server as host:port.", section=RUN)
    )
    session: str = field(
        default="default",
        metadata=doc("Session to join; the first participant creates it.", section=RUN),
    )
    offline: bool = field(
        default=False, metadata=doc("Train alone, without a server.", section=RUN)
    )
    mode: Mode = field(
        default="federated",
        metadata=doc(
            "With a server: federated (weight deltas averaged into global versions, experience "
            "shared) or pbt (population-based training: the session is a population; this "
            "participant trains alone with its own hyperparameters, reports its model after "
            "every evaluation, and when it ranks in the bottom copies a better member and "
            "explores). The session's first participant fixes it.",
            section=RUN,
        ),
    )
    algo: Algorithm = field(
        default="dqn",
        metadata=doc(
            "dqn (off-policy, replay; Discrete actions) or ppo (on-policy actor-critic; "
            "Discrete or Box actions). PPO pushes after every rollout update and refuses the "
            "experience exchange options: others' experience is off-policy data.",
            section=RUN,
        ),
    )
    episodes: int = field(
        default=1_000,
        metadata=doc(
            "Episodes to train in this run; 0 prints the session's status and exits.", section=RUN
        ),
    )
    total_episodes: int = field(
        default=0,
        metadata=doc(
            "Raise the session's total-episodes goal to this before training (0: leave it).",
            section=RUN,
        ),
    )
    max_env_steps: int = field(
        default=0,
        metadata=doc(
            "Also stop once this many env steps are done in total; 0 for no limit.", section=RUN
        ),
    )
    learners: int = field(
        default=1,
        metadata=doc(
            "Data-parallel learner ranks (torch.distributed: NCCL on CUDA, one GPU each; gloo on "
            "the CPU), each with its own --workers actors and replay, gradients averaged every "
            "step; rank 0 saves, logs and federates. Under torchrun, WORLD_SIZE sets it.",
            section=RUN,
        ),
    )
    engine: EngineConfig = field(
        default_factory=EngineConfig,
        metadata=section("Environments, actors, exploration, evaluation."),
    )
    learner: LearnerConfig = field(
        default_factory=LearnerConfig,
        # The learner's seed comes from the engine's seed stream.
        metadata=section("The DQN learner (its device and amp serve PPO too).", omit=("seed",)),
    )
    ppo: PPOConfig = field(
        default_factory=PPOConfig,
        # Seeded from the engine's seed stream; device and amp are the learner section's.
        metadata=section("The PPO learner (--algo ppo).", omit=PPO_FOLLOWS_LEARNER),
    )
    network: NetworkConfig = field(
        default_factory=NetworkConfig,
        metadata=section("The networks' torso: MLP or causal transformer."),
    )
    share: Share = field(
        default="both",
        metadata=doc(
            "What this participant shares: weights, experience (it then keeps its own model), "
            "or both.",
            section=FEDERATION,
        ),
    )
    role: Role = field(
        default="learner",
        metadata=doc(
            "learner: trains and shares what --share says; actor: only acts: plays the newest "
            "global model and pushes its experience for the session's learners, never "
            "trains (Ape-X's actors across the federation; DQN with --share both).",
            section=FEDERATION,
        ),
    )
    sync_interval: int = field(
        default=2,
        metadata=doc(
            "DQN syncing asynchronously (below --rounds-from members pushing weights, or "
            "with --round-wait-s 0): episodes "
            "between pushes of this participant's progress to the server (at most one update "
            "is in flight, so a short interval cannot flood the server). PPO pushes after "
            "every rollout update.",
            section=FEDERATION,
        ),
    )
    sync_steps: int | None = field(
        default=None,
        metadata=doc(
            "DQN: env steps between syncs. In synchronous rounds, the round's length (default "
            "128). Asynchronously, also push (and share experience) once this many env steps "
            "have passed since the last push, if that comes before --sync-interval's "
            "episodes, so that long episodes do not stretch the time between syncs (default "
            "0: episodes only).",
            section=FEDERATION,
        ),
    )
    round_wait_s: float | None = field(
        default=None,
        metadata=doc(
            "DQN, synchronous rounds: every --sync-steps env steps push, wait up to this "
            "many seconds for the server's version holding that push "
            "(one update from every active member), adopt it and the round's experience, "
            "then train on, so that every member starts each round from the same average. "
            "Each round waits for the slowest member. Default: 5 s wherever rounds can form "
            "(DQN sharing weights or both), with --rounds-from 3. 0: asynchronous at any "
            "size.",
            section=FEDERATION,
        ),
    )
    rounds_from: int = field(
        default=ROUNDS_FROM,
        metadata=doc(
            "Sync in rounds only while at least this many members push weights (the "
            "server's count of those it heard from within its --active-window-s), "
            "asynchronously while fewer do: on CartPole and LunarLander rounds made fours "
            "faster and pairs slower (docs/federation.md). 1: rounds at any size.",
            section=FEDERATION,
        ),
    )
    shared_warmup: bool = field(
        default=True,
        metadata=doc(
            "DQN sharing both: sync in rounds (of --sync-steps, 128 unless given) until the "
            "learner starts, so that the group's experience fills every member's replay to "
            "learning_starts together instead of each member filling its own at env speed; "
            "then as --round-wait-s says. Alone it changes nothing.",
            section=FEDERATION,
        ),
    )
    delta_dtype: Literal["bfloat16", "float16", "float32"] | None = field(
        default=None,
        metadata=doc(
            "Wire type of pushed weight deltas (zstd-compressed in any case). Default: "
            "float32 in rounds (a round's small delta loses too much to bfloat16's 8 bits), "
            "bfloat16 asynchronously (half the bytes; what rounding leaves out goes with "
            "the next push).",
            section=FEDERATION,
        ),
    )
    target_at_adoption: TargetAtAdoption = field(
        default="shift",
        metadata=doc(
            "Target network when a global model is adopted: shift it by the same change as "
            "the online net (the others' progress; alone in a session the change is zero), "
            "reset it to the adopted model, or keep it.",
            section=FEDERATION,
        ),
    )
    exchange: ExchangeConfig = field(
        default_factory=ExchangeConfig,
        metadata=section("Experience exchange (federated DQN runs)."),
    )
    tls: ConnectionSecurity = field(
        default_factory=ConnectionSecurity,
        metadata=section("How to reach the server: TLS, a token, or plaintext."),
    )
    state_dir: Path = field(
        default=Path("fedrl-state"),
        metadata=doc(
            "Root of the state dirs; this participant's files go to <state-dir>/<participant-id>/.",
            path="dir",
            section=OUTPUT,
        ),
    )
    save_model_every: int = field(
        default=10, metadata=doc("Episodes between saves of the latest model.", section=OUTPUT)
    )
    save_progress_every: int = field(
        default=50,
        metadata=doc(
            "Episodes between saves of the full progress (optimizer and schedule state too).",
            section=OUTPUT,
        ),
    )
    log_interval: float = field(
        default=5.0, metadata=doc("Seconds between progress lines on stderr.", section=OUTPUT)
    )
    tensorboard: str = field(
        default="",
        metadata=doc(
            "Directory for TensorBoard event files, one subfolder per participant; empty: the "
            "state dir, so `tensorboard --logdir <state-dir>` shows every participant as a "
            'run; "off": none.',
            section=OUTPUT,
        ),
    )

    def __post_init__(self) -> None:
        if self.algo not in ("dqn", "ppo"):
            raise ValueError(f"algo must be dqn or ppo, got {self.algo!r}")
        if self.algo == "ppo":
            changed = [
                f.name
                for f in dataclasses.fields(ExchangeConfig)
                if getattr(self.exchange, f.name) != getattr(ExchangeConfig(), f.name)
            ]
            if changed:
                refuse_for_ppo(changed)
            if self.share == "experience":
                refuse_for_ppo(["share"])
            if self.role == "actor":
                refuse_for_ppo(["role"])
        if self.mode not in ("federated", "pbt"):
            raise ValueError(f"mode must be federated or pbt, got {self.mode!r}")
        if self.mode == "pbt" and self.offline:
            raise ValueError("--mode pbt trains in a population on a server: drop --offline")
        if self.mode == "pbt" and self.engine.eval_interval == 0:
            raise ValueError(
                "--mode pbt ranks members by their greedy evaluation: give --eval-interval > 0"
            )
        if self.mode == "pbt" and self.role == "actor":
            raise ValueError(
                "--mode pbt: every member trains its own weights; --role actor trains none"
            )
        for name in ("save_model_every", "save_progress_every", "sync_interval", "learners"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.learners > 1 and self.role == "actor":
            raise ValueError(
                f"--learners {self.learners} runs data-parallel learner ranks, and --role actor "
                "trains nothing: drop --learners, or use --role learner"
            )
        for name in ("episodes", "total_episodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.sync_steps is not None and self.sync_steps < 0:
            raise ValueError(f"sync_steps must be >= 0, got {self.sync_steps}")
        self.sync_plan()  # refuses rounds that could not form before any work starts
        if self.max_env_steps < 0:
            raise ValueError(f"max_env_steps must be >= 0, got {self.max_env_steps}")
        if not self.log_interval > 0:
            raise ValueError(f"log_interval must be > 0, got {self.log_interval}")

    @property
    def learner_config(self) -> LearnerConfig | PPOConfig:
        """The chosen algorithm's learner config; PPO's device and amp follow --device, --amp."""
        if self.algo == "dqn":
            return self.learner
        return dataclasses.replace(
            self.ppo, device=self.learner.device, amp="auto" if self.learner.amp else "off"
        )

    def architecture(self, obs_shape: tuple[int, ...] = ()) -> str:
        """The model's family and shape for observations of `obs_shape`, e.g.
        "dqn/dueling-mlp-256x256", "ppo/mlp-64x64" or, for Atari's frame stacks,
        "dqn/dueling-cnn-nature"."""
        if self.algo == "ppo":
            return ppo_architecture_name(self.ppo.ppo_hidden, self.network, obs_shape)
        return architecture_name(self.learner.hidden, self.learner.dueling, self.network, obs_shape)

    def sync_plan(self) -> SyncPlan:
        """When this participant syncs and in what type, the defaults resolved for its
        algorithm and share (fedrl.client.federation.sync_plan)."""
        return sync_plan(
            round_wait_s=self.round_wait_s,
            sync_steps=self.sync_steps,
            delta_dtype=self.delta_dtype,
            rounds_from=self.rounds_from,
            sync_interval=self.sync_interval,
            share=self.effective_share,
            on_policy=self.algo == "ppo",
            shared_warmup=self.shared_warmup,
        )

    @property
    def effective_share(self) -> Share:
        """What the sync loop shares: PPO shares weights only, whatever --share says."""
        return "weights" if self.algo == "ppo" else self.share


EXCHANGE_FIELDS = tuple(f.name for f in dataclasses.fields(ExchangeConfig))
"""The experience exchange options, which PPO refuses."""
DQN_ONLY = (
    "target_at_adoption",
    "round_wait_s",
    "rounds_from",
    "shared_warmup",
    *EXCHANGE_FIELDS,
    "n_step",
    "episodic_life",
    "exploration_base",
    "exploration_alpha",
    "replay_ratio",
    "steps_per_slot",
    "slots_per_worker",
    "weights_interval",
    *(f.name for f in dataclasses.fields(LearnerConfig) if f.name not in ("device", "amp", "seed")),
)
"""Options only DQN reads; with --algo ppo they are refused rather than ignored."""


def refuse_for_ppo(names: list[str]) -> None:
    """ValueError naming the DQN-only options given to a PPO run."""
    flags = ", ".join("--" + name.replace("_", "-") for name in names)
    exchange = [name for name in names if name in EXCHANGE_FIELDS]
    why = (
        "experience exchange is off-policy data, and PPO learns only from its own rollouts"
        if exchange
        else "they are DQN's"
    )
    raise ValueError(f"--algo ppo does not take {flags}: {why}; drop them or use --algo dqn")


def check_algorithm_options(config: TrainConfig, given: Set[str]) -> None:
    """Refuse options the chosen algorithm would ignore; `given` are the ones set explicitly.

    An option is refused even at its default value: whoever typed it expected it to act.
    """
    if config.algo == "ppo":
        named = [name for name in DQN_ONLY if name in given]
        if named:
            refuse_for_ppo(named)
    else:
        # --seed, --device and --amp are the engine's and the learner's, not PPO's own.
        named = [
            f.name
            for f in dataclasses.fields(PPOConfig)
            if f.name in given and f.name not in PPO_FOLLOWS_LEARNER
        ]
        if named:
            flags = ", ".join("--" + name.replace("_", "-") for name in named)
            raise ValueError(f"{flags} set PPO's learner: add --algo ppo, or drop them")


def train_config_toml(config: TrainConfig) -> str:
    """A training configuration as a config file: `fedrl-client --config FILE` runs it."""
    return config_to_toml(
        config, title="fedrl-client settings; run them with `fedrl-client --config FILE`"
    )
