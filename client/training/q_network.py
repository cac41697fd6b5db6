"""The Q-network, and any network's weights as the named numpy arrays the federation exchanges."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedrl.client.training.masking import masked_outputs
from fedrl.client.training.networks import NetworkConfig, build_torso

DEFAULT_NETWORK = NetworkConfig()


class QNetwork(nn.Module):
    """A torso (fedrl.client.training.networks) and one Q-value per action on top.

    With ``dueling`` the torso's features feed two linear heads, a state value
    V(s) and advantages A(s, a), joined as Q = V + A - mean_a A (Wang et al.
    2016, eq. 9): subtracting the mean makes V and A identifiable, so the value
    head learns from every transition, not only from the action taken.
    With ``action_mask`` the observation ends with the legal-action mask and
    illegal actions' Q-values are masked (fedrl.client.training.masking).
    """

    def __init__(
        self,
        torso: nn.Module,
        width: int,
        n_actions: int,
        *,
        dueling: bool,
        action_mask: bool = False,
    ) -> None:
        super().__init__()
        self.torso = torso
        self.dueling = dueling
        self.action_mask = action_mask
        if dueling:
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, n_actions)
        else:
            self.head = nn.Linear(width, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        flat = obs.flatten(1)
        features = self.torso(flat)
        q: torch.Tensor
        if self.dueling:
            advantage = self.advantage(features)
            q = self.value(features) + advantage - advantage.mean(dim=1, keepdim=True)
        else:
            q = self.head(features)
        return masked_outputs(q, flat) if self.action_mask else q


def build_q_network(
    obs_shape: tuple[int, ...],
    n_actions: int,
    *,
    hidden: tuple[int, ...] = (256, 256),
    dueling: bool = True,
    network: NetworkConfig = DEFAULT_NETWORK,
    action_mask: bool = False,
) -> nn.Module:
    """A fresh Q-network: float32 [B, *obs_shape] -> Q-values [B, n_actions].

    `hidden` are the MLP's widths; the transformer (network.policy) has its own.
    `action_mask`: observations end with the legal-action mask, and illegal
    actions get fedrl.client.training.masking.MASKED.
    """
    if n_actions < 1:
        raise ValueError(f"n_actions must be at least 1, got {n_actions}")
    torso, width = build_torso(obs_shape, hidden=hidden, activation="relu", network=network)
    return QNetwork(torso, width, n_actions, dueling=dueling, action_mask=action_mask)


def architecture_name(
    hidden: tuple[int, ...],
    dueling: bool,
    network: NetworkConfig = DEFAULT_NETWORK,
    obs_shape: tuple[int, ...] = (),
) -> str:
    """The ModelSpec.algorithm string, e.g. "dqn/dueling-mlp-256x256".

    Two participants whose networks differ in shape must never share a session,
    and this name is part of the spec hash that enforces it.
    """
    return f"dqn/{'dueling-' if dueling else ''}{network.describe(hidden, obs_shape)}"


def named_arrays(module: nn.Module) -> list[tuple[str, np.ndarray]]:
    """Float32 CPU copies of the parameters, in ``named_parameters()`` order.

    Copies, so the caller may keep them while training goes on. These names and
    shapes are the federated model's tensors.
    """
    return [
        (name, param.detach().to("cpu", torch.float32).numpy().copy())
        for name, param in module.named_parameters()
    ]


def load_named_arrays(module: nn.Module, arrays: Sequence[tuple[str, np.ndarray]]) -> None:
    """Copy arrays into the module's parameters in place.

    Strict: the names, their order and every shape must match exactly, because
    a silently partial load would train a different model than the session's.
    Checked in full before anything is written, so a bad list changes nothing.
    """
    params = list(module.named_parameters())
    if len(arrays) != len(params):
        raise ValueError(f"expected {len(params)} tensors, got {len(arrays)}")
    for index, ((name, param), (got_name, array)) in enumerate(zip(params, arrays, strict=True)):
        if got_name != name:
            raise ValueError(f"tensor {index} is named {got_name!r}, expected {name!r}")
        if tuple(array.shape) != tuple(param.shape):
            raise ValueError(
                f"tensor {name!r} has shape {tuple(array.shape)}, expected {tuple(param.shape)}"
            )
        if not np.issubdtype(array.dtype, np.floating):
            raise ValueError(f"tensor {name!r} has dtype {array.dtype}, expected a float type")
        if not np.all(np.isfinite(array)):
            raise ValueError(f"tensor {name!r} holds a NaN or infinite value")
    with torch.no_grad():
        for (_, param), (_, array) in zip(params, arrays, strict=True):
            param.copy_(torch.from_numpy(np.asarray(array, dtype=np.float32)))
