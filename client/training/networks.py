"""Torsos: what turns an observation batch into features, chosen by the policy setting.

Every network here is a torso plus heads: the Q-network puts Q-value heads
on one torso, the actor-critic a policy head and a value head on one torso
each. A torso maps a FLAT observation batch [B, prod(obs_shape)] to features
[B, width], so the heads and the code around them never look at the
observation's layout. `build_torso` is where an observation kind picks its
torso: the MLP for flat vectors (the default), the Nature CNN for image
observations (fedrl.client.training.cnn; chosen by the observations' shape,
whatever the policy setting says for flat ones), and the causal transformer
over the last k observations (`--policy transformer`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from fedrl.client.training.cnn import FEATURES, NatureCNN, is_image
from fedrl.client.training.transformer import HEAD_WIDTH, CausalTransformer
from fedrl.common.config_cli import doc

Policy = Literal["mlp", "transformer"]
Activation = Literal["relu", "tanh"]


@dataclass(frozen=True)
class NetworkConfig:
    """Which torso the networks use; the same for DQN and PPO."""

    policy: Policy = field(
        default="mlp",
        metadata=doc(
            "Torso of every network: an MLP over the current observation, or a causal transformer "
            "over the last --context observations of the episode. Image observations (Atari's "
            "frame stacks) always get the Nature CNN."
        ),
    )
    context: int = field(
        default=16,
        metadata=doc(
            "Transformer only: observations each decision sees (the actors keep each env's window)."
        ),
    )
    transformer_layers: int = field(
        default=2,
        metadata=doc("Transformer only: attention blocks."),
    )
    transformer_width: int = field(
        default=64,
        metadata=doc(
            "Transformer only: model width, a multiple of 16 (one attention head per 16)."
        ),
    )

    def __post_init__(self) -> None:
        if self.policy not in ("mlp", "transformer"):
            raise ValueError(f"policy must be mlp or transformer, got {self.policy!r}")
        if self.context < 1:
            raise ValueError(f"context must be at least 1, got {self.context}")
        if self.transformer_layers < 1:
            raise ValueError(
                f"transformer_layers must be at least 1, got {self.transformer_layers}"
            )
        if self.transformer_width < HEAD_WIDTH or self.transformer_width % HEAD_WIDTH:
            raise ValueError(
                f"transformer_width must be a positive multiple of {HEAD_WIDTH}, "
                f"got {self.transformer_width}"
            )

    @property
    def window(self) -> int:
        """Observations per network input: k for the transformer, 0 (no window) for the MLP."""
        return self.context if self.policy == "transformer" else 0

    def describe(self, hidden: tuple[int, ...], obs_shape: tuple[int, ...] = ()) -> str:
        """The torso's part of an architecture name, e.g. "mlp-64x64", "transformer-k16-l2-w64",
        or "cnn-nature" for image observations of `obs_shape`.

        Architecture names go into the model spec's hash: two participants whose
        torsos differ in shape must never share a session.
        """
        if is_image(obs_shape):
            return "cnn-nature"
        if self.policy == "transformer":
            return (
                f"transformer-k{self.context}-l{self.transformer_layers}-w{self.transformer_width}"
            )
        return f"mlp-{'x'.join(str(h) for h in hidden) or 'linear'}"


def is_mlp(network: NetworkConfig, obs_shape: tuple[int, ...]) -> bool:
    """Whether `build_torso` makes an MLP for these observations (light: one per head in PPO)."""
    return network.policy == "mlp" and not is_image(obs_shape)


def build_torso(
    obs_shape: tuple[int, ...],
    *,
    hidden: tuple[int, ...],
    activation: Activation,
    network: NetworkConfig,
) -> tuple[nn.Module, int]:
    """A fresh torso for observations of `obs_shape`, and the width of its features.

    For the transformer, `obs_shape` is the window's (context, features + 1):
    see fedrl.client.training.obs_window. Images get the Nature CNN.
    """
    if not obs_shape or any(d <= 0 for d in obs_shape):
        raise ValueError(f"obs_shape must be a non-empty tuple of positive sizes, got {obs_shape}")
    if is_image(obs_shape):
        if network.policy == "transformer":
            raise ValueError(
                f"observations of shape {obs_shape} are images, which the Nature CNN reads; "
                "drop --policy transformer"
            )
        return NatureCNN(obs_shape), FEATURES
    if network.policy == "transformer":
        expected = network.context
        if len(obs_shape) != 2 or obs_shape[0] != expected or obs_shape[1] < 2:
            raise ValueError(
                f"the transformer reads windows of shape ({expected}, features + 1), "
                f"got observations of shape {obs_shape}; make the env with window={expected}"
            )
        torso = CausalTransformer(
            obs_dim=obs_shape[1] - 1,
            context=network.context,
            width=network.transformer_width,
            layers=network.transformer_layers,
        )
        return torso, network.transformer_width
    if any(h <= 0 for h in hidden):
        raise ValueError(f"hidden layer sizes must be positive, got {hidden}")
    layers: list[nn.Module] = []
    width = math.prod(obs_shape)
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU() if activation == "relu" else nn.Tanh()]
        width = size
    return nn.Sequential(*layers), width
