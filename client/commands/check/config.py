"""The check's configuration, and the settings its probe measures at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fedrl.client.federation.channel import ConnectionSecurity
from fedrl.common.config_cli import doc, section

ENV_WIDTHS = (1, 4, 16, 64)
BATCH_SIZES = (32, 64, 128, 256)
QUICK_ENV_WIDTHS = (4, 32)
QUICK_BATCH_SIZES = (32, 128)
MINIBATCH_SIZES = (256, 512, 1024, 2048)
QUICK_MINIBATCH_SIZES = (256, 1024)
Algorithm = Literal["dqn", "ppo"]


@dataclass(frozen=True)
class CheckConfig:
    """The system check."""

    env: str = field(
        default="CartPole-v1",
        metadata=doc("Gymnasium env id to probe with (the one you will train)."),
    )
    algo: Algorithm = field(
        default="dqn",
        metadata=doc(
            "Recommend for this algorithm: DQN's batch size, or PPO's rollout length and "
            "minibatch size."
        ),
    )
    hidden: tuple[int, ...] = field(
        default=(256, 256),
        metadata=doc(
            "Hidden layer widths of the network to probe with (for --algo ppo, 64,64 unless given)."
        ),
    )
    server: str = field(
        default="",
        metadata=doc("host:port of a fedrl server to check (reachability, TLS); empty to skip."),
    )
    tls: ConnectionSecurity = field(
        default_factory=ConnectionSecurity,
        # The health call the check makes needs no participant credentials.
        metadata=section("How to reach the server.", omit=("token_file",)),
    )
    quick: bool = field(
        default=False,
        metadata=doc("A ~3 s probe at fewer settings instead of ~15 s (rougher recommendation)."),
    )
    as_json: bool = field(
        default=False, metadata=doc("Print the report as one JSON object.", flag="--json")
    )

    def __post_init__(self) -> None:
        if self.algo not in ("dqn", "ppo"):
            raise ValueError(f"algo must be dqn or ppo, got {self.algo!r}")
        if any(h <= 0 for h in self.hidden):
            raise ValueError(f"hidden layer sizes must be positive, got {self.hidden}")

    @property
    def probe_s(self) -> float:
        """Seconds each single measurement runs."""
        return 0.15 if self.quick else 0.5
