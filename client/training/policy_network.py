"""The actor-critic network of PPO and the distributions of its policy.

A policy head and a value head on torsos (fedrl.client.training.networks).
The MLPs stay apart, one per head: the value loss then never pulls on the
policy's features, and no loss weight has to balance the two (what learned
CartPole fastest). A heavy torso, the transformer (or a convolutional one),
is shared by both heads: one forward pass per step instead of two, which
halves what collection and learning pay for it.

Discrete actions: a categorical distribution over softmax(logits). Box
actions: a diagonal Gaussian whose mean the policy head gives and whose log
standard deviation is one learned vector, the same in every state (the
continuous-control setup of Schulman et al. 2017, sec. 6.1). A sampled
action is clipped to the space's bounds when it is sent to the env, and its
log-probability is that of the sample itself; the greedy action is the mode:
the most probable action, or the mean, clipped. Where observations end with
a legal-action mask (two-player games), illegal actions' logits are masked
(fedrl.client.training.masking): they are never sampled and add nothing to
the entropy.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedrl.client.training.masking import masked_outputs
from fedrl.client.training.networks import NetworkConfig, build_torso, is_mlp
from fedrl.client.training.vector_env import EnvShape

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def categorical_log_prob(logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log π(a|s) for int64 actions [B] under logits [B, n]."""
    return logits.log_softmax(dim=-1).gather(1, action.unsqueeze(1)).squeeze(1)


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = −Σ_a π(a|s) log π(a|s), per row [B]."""
    log_p = logits.log_softmax(dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def gaussian_log_prob(
    mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor
) -> torch.Tensor:
    """log N(a; μ, diag σ²) = Σ_i −(a_i − μ_i)² / 2σ_i² − log σ_i − log √(2π), per row [B]."""
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - _LOG_SQRT_2PI).sum(dim=-1)


def gaussian_entropy(log_std: torch.Tensor, rows: int) -> torch.Tensor:
    """H = Σ_i ½ + log √(2π) + log σ_i, the same for every row [B]."""
    return (0.5 + _LOG_SQRT_2PI + log_std).sum().expand(rows)


class _Head(nn.Module):
    """A torso and one linear layer on its features."""

    def __init__(self, torso: nn.Module, width: int, outputs: int, *, gain: float) -> None:
        super().__init__()
        self.torso = torso
        self.head = nn.Linear(width, outputs)
        # Small policy logits at the start (gain 0.01) make the first policy
        # near uniform; Andrychowicz et al. 2021 found this among PPO's most
        # helpful choices.
        nn.init.orthogonal_(self.head.weight, gain)
        nn.init.zeros_(self.head.bias)

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.torso(flat))
        return out


class ActorCritic(nn.Module):
    """Observations [B, *obs_shape] to the policy's parameters and the state value V(s)."""

    action_low: torch.Tensor
    action_high: torch.Tensor

    def __init__(
        self,
        policy_torso: nn.Module,
        value_torso: nn.Module | None,
        width: int,
        shape: EnvShape,
        *,
        log_std_init: float,
    ) -> None:
        """`value_torso` None: the value head shares the policy's torso (its tensors are named
        under `policy.torso` only)."""
        super().__init__()
        self.discrete = shape.discrete
        self.action_mask = shape.action_mask
        self.shared = value_torso is None
        self.policy = _Head(policy_torso, width, shape.n_actions or shape.action_dim, gain=0.01)
        self.value = _Head(policy_torso if value_torso is None else value_torso, width, 1, gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((shape.action_dim,), float(log_std_init)))
            # Bounds for the greedy action; buffers, so they move with .to() and
            # export with the graph, but not parameters: nothing to federate.
            low = torch.tensor(shape.action_low, dtype=torch.float32)
            high = torch.tensor(shape.action_high, dtype=torch.float32)
            self.register_buffer("action_low", low, persistent=False)
            self.register_buffer("action_high", high, persistent=False)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, n] or mean [B, d], V(s) [B])."""
        flat = obs.flatten(1)
        if self.shared:
            features = self.policy.torso(flat)
            params = self.policy.head(features)
            value = self.value.head(features).squeeze(-1)
        else:
            params, value = self.policy(flat), self.value(flat).squeeze(-1)
        return self._masked(params, flat), value

    def _masked(self, params: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        return masked_outputs(params, flat) if self.action_mask else params

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log π(a|s), from the policy head's output."""
        if self.discrete:
            return categorical_log_prob(params, action)
        return gaussian_log_prob(params, self.log_std.to(params.dtype), action)

    def log_prob_entropy(
        self, params: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log π(a|s) and the entropy of π(·|s), from the policy head's output."""
        if self.discrete:
            return categorical_log_prob(params, action), categorical_entropy(params)
        log_std = self.log_std.to(params.dtype)
        return gaussian_log_prob(params, log_std, action), gaussian_entropy(log_std, len(params))

    def sample(
        self, params: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """One action per row: drawn from the categorical, or μ + σ·ε (not clipped)."""
        if self.discrete:
            return torch.multinomial(params.softmax(dim=-1), 1, generator=generator).squeeze(1)
        noise = torch.randn(params.shape, generator=generator, dtype=params.dtype)
        return params + noise * self.log_std.exp()

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The mode: argmax of the logits (int64 [B]), or the mean within bounds ([B, d])."""
        flat = obs.flatten(1)
        params = self._masked(self.policy(flat), flat)
        if self.discrete:
            return params.argmax(dim=1)
        return torch.maximum(torch.minimum(params, self.action_high), self.action_low)


class GreedyPolicy(nn.Module):
    """The actor-critic's greedy action as a module of its own (what export writes)."""

    def __init__(self, net: ActorCritic) -> None:
        super().__init__()
        self.net = net

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net.greedy(obs)


def build_actor_critic(
    obs_shape: tuple[int, ...],
    shape: EnvShape,
    *,
    hidden: tuple[int, ...],
    network: NetworkConfig,
    log_std_init: float = 0.0,
) -> ActorCritic:
    """A fresh actor-critic for observations of `obs_shape` and the actions of `shape`.

    MLP torsos are one per head; any other torso is shared by both heads.
    """
    torsos: list[nn.Module] = []
    mlp = is_mlp(network, obs_shape)
    for _ in range(2 if mlp else 1):
        torso, width = build_torso(obs_shape, hidden=hidden, activation="tanh", network=network)
        if mlp:
            # Orthogonal weights with gain √2 and zero biases: the initialisation
            # of the PPO paper's code, which measurably helps small MLPs.
            for layer in torso.modules():
                if isinstance(layer, nn.Linear):
                    nn.init.orthogonal_(layer.weight, math.sqrt(2))
                    nn.init.zeros_(layer.bias)
        torsos.append(torso)
    value_torso = torsos[1] if len(torsos) == 2 else None
    return ActorCritic(torsos[0], value_torso, width, shape, log_std_init=log_std_init)


def ppo_architecture_name(
    hidden: tuple[int, ...], network: NetworkConfig, obs_shape: tuple[int, ...] = ()
) -> str:
    """The ModelSpec.algorithm string of an actor-critic, e.g. "ppo/mlp-64x64"."""
    return f"ppo/{network.describe(hidden, obs_shape)}"
