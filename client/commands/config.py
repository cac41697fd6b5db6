"""`TrainConfig`: every knob of the training command, from which its options are made.

One frozen dataclass per command (habit from CleanRL): the options, their
defaults and their help text all come from the fields and their metadata
(fedrl.common.config_cli), so the two cannot drift apart. The engine, the
learner, the experience exchange and the connection's security are sections:
their own configs, whose fields are options of this command too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fedrl.client.federation.channel import ConnectionSecurity
from fedrl.client.federation.experience_sync import ExchangeConfig
from fedrl.client.federation.sync_loop import Share
from fedrl.client.training.engine import EngineConfig
from fedrl.client.training.learner import LearnerConfig, TargetAtAdoption
from fedrl.common.config_cli import doc, section


@dataclass(frozen=True)
class TrainConfig:
    """The training command: who trains, how long, where state lives, and the engine and learner."""

    participant_id: str = field(
        default="",
        metadata=doc(
            "Who trains: names the state dir (Unicode allowed). Generated and remembered when "
            "absent (federated runs; --offline needs one)."
        ),
    )
    server: str = field(default="localhost:7443", metadata=doc("Aggregation server as host:port."))
    session: str = field(
        default="default", metadata=doc("Session to join; the first participant creates it.")
    )
    offline: bool = field(default=False, metadata=doc("Train alone, without a server."))
    episodes: int = field(
        default=1_000,
        metadata=doc("Episodes to train in this run; 0 prints the session's status and exits."),
    )
    total_episodes: int = field(
        default=0,
        metadata=doc(
            "Raise the session's total-episodes goal to this before training (0: leave it)."
        ),
    )
    share: Share = field(
        default="both",
        metadata=doc(
            "What this participant shares: weights, experience (it then keeps its own model), "
            "or both."
        ),
    )
    sync_interval: int = field(
        default=2,
        metadata=doc(
            "Episodes between pushes of this participant's progress to the server (at most one "
            "update is in flight, so a short interval cannot flood the server)."
        ),
    )
    delta_dtype: Literal["bfloat16", "float16", "float32"] = field(
        default="bfloat16",
        metadata=doc("Wire type of pushed weight deltas (zstd-compressed in any case)."),
    )
    target_at_adoption: TargetAtAdoption = field(
        default="reset",
        metadata=doc(
            "Target network when a global model is adopted: reset it to the new model, keep "
            "it, or shift it by the same change as the online net (see Learner.set_weights "
            "for the figures)."
        ),
    )
    tls: ConnectionSecurity = field(
        default_factory=ConnectionSecurity,
        metadata=section("How to reach the server: TLS material, a token, or plaintext."),
    )
    max_env_steps: int = field(
        default=0,
        metadata=doc("Also stop once this many env steps are done in total; 0 for no limit."),
    )
    state_dir: Path = field(
        default=Path("fedrl-state"),
        metadata=doc(
            "Root of the state dirs; this participant's files go to <state-dir>/<participant-id>/.",
            path="dir",
        ),
    )
    save_model_every: int = field(
        default=10, metadata=doc("Episodes between saves of the latest model.")
    )
    save_progress_every: int = field(
        default=50,
        metadata=doc(
            "Episodes between saves of the full progress (optimizer and schedule state too)."
        ),
    )
    log_interval: float = field(
        default=5.0, metadata=doc("Seconds between progress lines on stderr.")
    )
    engine: EngineConfig = field(
        default_factory=EngineConfig,
        metadata=section("Collection, replay ratio and evaluation."),
    )
    learner: LearnerConfig = field(
        default_factory=LearnerConfig,
        # The learner's seed comes from the engine's seed stream.
        metadata=section("The DQN learner.", omit=("seed",)),
    )
    exchange: ExchangeConfig = field(
        default_factory=ExchangeConfig,
        metadata=section("Experience exchange with the session (federated runs only)."),
    )

    def __post_init__(self) -> None:
        for name in ("save_model_every", "save_progress_every", "sync_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("episodes", "total_episodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_env_steps < 0:
            raise ValueError(f"max_env_steps must be >= 0, got {self.max_env_steps}")
        if not self.log_interval > 0:
            raise ValueError(f"log_interval must be > 0, got {self.log_interval}")
