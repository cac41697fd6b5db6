"""The DQN learner's configuration: every knob of Double DQN, dueling heads, n-step and PER.

One frozen dataclass whose fields are `fedrl-client` options
(fedrl.common.config_cli), and the names of what a running learner may change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fedrl.common.config_cli import doc

TargetAtAdoption = Literal["reset", "keep", "shift"]
"""What the target network does when the online one adopts other weights (Learner.set_weights)."""
TARGET_AT_ADOPTION: tuple[TargetAtAdoption, ...] = ("reset", "keep", "shift")

RECONFIGURABLE = frozenset({"lr", "gamma", "target_update_interval"})
"""LearnerConfig fields a running learner may change (Learner.reconfigure)."""


@dataclass(frozen=True)
class LearnerConfig:
    """Every knob of the learner; the defaults learned CartPole-v1 fastest.

    Each default was weighed against its alternatives one change at a time, in
    the training engine's serial mode with its own defaults (docs/benchmarks.md,
    DQN defaults). The gradient clip guards against a diverging update; where
    none diverges it changes nothing.
    """

    lr: float = field(default=1e-3, metadata=doc("Adam learning rate."))
    gamma: float = field(
        default=0.99,
        metadata=doc(
            "Per-step discount; the n-step accumulator bakes it into each batch's discount."
        ),
    )
    batch_size: int = field(default=64, metadata=doc("Transitions per gradient step."))
    double_dqn: bool = field(
        default=True,
        metadata=doc("Pick the next action with the online net, value it with the target net."),
    )
    dueling: bool = field(default=True, metadata=doc("Separate value and advantage heads."))
    hidden: tuple[int, ...] = field(
        default=(256, 256), metadata=doc("Hidden layer widths of the Q-network MLP.")
    )
    prioritized: bool = field(
        default=True, metadata=doc("Prioritized replay; False samples uniformly.")
    )
    alpha: float = field(
        default=0.6,
        metadata=doc("Priority exponent: 0 is uniform, 1 is fully proportional to |TD error|."),
    )
    beta0: float = field(
        default=0.4, metadata=doc("Initial importance-sampling exponent, annealed linearly to 1.")
    )
    beta_anneal_updates: int = field(
        default=20_000, metadata=doc("Updates over which beta goes from beta0 to 1.")
    )
    priority_eps: float = field(
        default=1e-6, metadata=doc("Added to |TD error| so no transition's priority is ever zero.")
    )
    huber_delta: float | None = field(
        default=1.0, metadata=doc("Huber loss threshold; none for the plain squared error.")
    )
    grad_clip_norm: float | None = field(
        default=10.0, metadata=doc("Clip the global gradient norm to this; none to not clip.")
    )
    target_update: Literal["hard", "polyak"] = field(
        default="hard",
        metadata=doc('Copy the online net into the target ("hard") or move it by polyak_tau.'),
    )
    target_update_interval: int = field(
        default=500,
        metadata=doc(
            "Updates between target-network updates for a learner alone; "
            "the target period's data exponent lengthens it for one fed others' experience."
        ),
    )
    target_period_data_exponent: float = field(
        default=0.5,
        metadata=doc(
            "The target period grows as (transitions credited, others' included, per own "
            "env step) to this power: 0 keeps it fixed; 0.5 doubles it for a learner fed "
            "by four participants' data."
        ),
    )
    polyak_tau: float = field(
        default=0.005,
        metadata=doc(
            "Fraction of the way the target moves toward the online net per polyak update."
        ),
    )
    replay_capacity: int = field(
        default=100_000, metadata=doc("Transitions the replay holds before overwriting the oldest.")
    )
    learning_starts: int = field(
        default=1_000, metadata=doc("Transitions in replay before training may start.")
    )
    sample_block: int = field(
        default=4,
        metadata=doc(
            "Updates drawn (and their priorities written back) together: fewer host syncs. "
            "The device update captures this many in one CUDA graph."
        ),
    )
    device: str = field(
        default="auto",
        metadata=doc('"auto" (CUDA when present, else CPU), "cpu", "cuda" or "cuda:N".'),
    )
    device_update: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata=doc(
            "The update wholly on the device: replay mirrored there, prioritized sampling, "
            "priorities and target update there, captured in one CUDA graph. auto: on CUDA "
            "where the replay's copy fits; "
            "on: also on the CPU, run eagerly; off: sample on the host everywhere."
        ),
    )
    stats_interval: int = field(
        default=256,
        metadata=doc(
            "Device update: updates between reading loss and TD statistics back to the host."
        ),
    )
    amp: bool = field(
        default=False,
        metadata=doc(
            "bfloat16 autocast for the forward passes on CUDA (slower for these small "
            "networks: docs/gpu.md); ignored on CPU."
        ),
    )
    compile: bool = field(default=False, metadata=doc("torch.compile the loss computation."))
    symmetries: bool = field(
        default=True,
        metadata=doc(
            "Two-player games: train on each drawn transition in a random symmetry of its "
            "board (connect four's mirror image, tic-tac-toe's eight)."
        ),
    )
    seed: int = field(default=0, metadata=doc("Seeds network initialisation and replay sampling."))

    def __post_init__(self) -> None:
        positive = {
            "lr": self.lr,
            "batch_size": self.batch_size,
            "beta_anneal_updates": self.beta_anneal_updates,
            "priority_eps": self.priority_eps,
            "target_update_interval": self.target_update_interval,
            "replay_capacity": self.replay_capacity,
            "sample_block": self.sample_block,
            "stats_interval": self.stats_interval,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"LearnerConfig.{name} must be > 0, got {value}")
        for name, unit in (("gamma", self.gamma), ("beta0", self.beta0)):
            if not 0.0 <= unit <= 1.0:
                raise ValueError(f"LearnerConfig.{name} must lie in [0, 1], got {unit}")
        if not 0.0 < self.polyak_tau <= 1.0:
            raise ValueError(f"LearnerConfig.polyak_tau must lie in (0, 1], got {self.polyak_tau}")
        if self.alpha < 0.0:
            raise ValueError(f"LearnerConfig.alpha must be >= 0, got {self.alpha}")
        if not 0.0 <= self.target_period_data_exponent <= 1.0:
            raise ValueError(
                "LearnerConfig.target_period_data_exponent must lie in [0, 1], "
                f"got {self.target_period_data_exponent}"
            )
        if any(width < 1 for width in self.hidden):
            raise ValueError(f"LearnerConfig.hidden widths must be >= 1, got {self.hidden}")
        if self.learning_starts < 0:
            raise ValueError(
                f"LearnerConfig.learning_starts must be >= 0, got {self.learning_starts}"
            )
        if self.device_update not in ("auto", "on", "off"):
            raise ValueError(
                'LearnerConfig.device_update must be "auto", "on" or "off", '
                f"got {self.device_update!r}"
            )
        if self.target_update not in ("hard", "polyak"):
            raise ValueError(
                'LearnerConfig.target_update must be "hard" or "polyak", '
                f"got {self.target_update!r}"
            )
        for name, bound in (
            ("huber_delta", self.huber_delta),
            ("grad_clip_norm", self.grad_clip_norm),
        ):
            if bound is not None and not bound > 0.0:
                raise ValueError(f"LearnerConfig.{name} must be > 0 or None, got {bound}")
