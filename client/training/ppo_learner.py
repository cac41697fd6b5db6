"""The PPO learner: GAE(λ), the clipped surrogate objective, the value loss and the entropy bonus.

Read top to bottom: the config, the advantage estimate (`gae`, Schulman et
al. 2016, "High-dimensional continuous control using generalized advantage
estimation", eq. 16), the loss (`ppo_loss`, Schulman et al. 2017, "Proximal
policy optimization algorithms", eq. 7 and 9), then `PPOLearner`, which runs
minibatch epochs over each rollout with advantage normalisation,
learning-rate annealing and gradient clipping. Collection happens elsewhere
(fedrl.client.training.ppo_actor); the caller hands over whole rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from fedrl.client.training.cnn import is_image
from fedrl.client.training.config_changes import refuse_fixed_changes
from fedrl.client.training.device import resolve_device, to_cpu
from fedrl.client.training.distributed import GradientSync
from fedrl.client.training.networks import NetworkConfig
from fedrl.client.training.policy_network import ActorCritic, build_actor_critic
from fedrl.client.training.q_network import load_named_arrays, named_arrays
from fedrl.client.training.rollout import Rollout
from fedrl.client.training.vector_env import EnvShape
from fedrl.common.config_cli import doc

STATE_FORMAT = 1
"""Version of ``PPOLearner.state_dict()``'s layout; bumped on any change to it."""

Amp = Literal["auto", "on", "off"]

RECONFIGURABLE = frozenset({"ppo_lr", "entropy_coef", "clip_range", "gae_lambda"})
"""PPOConfig fields a running learner may change (PPOLearner.reconfigure)."""


@dataclass(frozen=True)
class PPOConfig:
    """Every knob of PPO; the defaults are rl-baselines3-zoo's tuned CartPole-v1 settings.

    But for the learning rate: the zoo anneals it to 0 over its 100k-step
    budget, which solves CartPole in ~20 % fewer steps here (8 seeds: median
    8.1k against 10.1k), but would stop a longer run from learning at 100k
    steps; so it is constant unless anneal_steps gives the run's length.
    """

    rollout_steps: int = field(
        default=32,
        metadata=doc(
            "Steps each env collects per rollout; a PPO update learns from workers × envs × this."
        ),
    )
    epochs: int = field(
        default=20,
        metadata=doc("Passes over each rollout."),
    )
    minibatch_size: int = field(
        default=256,
        metadata=doc("Samples per gradient step (the rollout is split into equal minibatches)."),
    )
    ppo_lr: float = field(
        default=1e-3,
        metadata=doc("Adam learning rate of PPO."),
    )
    anneal_steps: int = field(
        default=0,
        metadata=doc(
            "Env steps over which PPO's learning rate falls linearly to 0, e.g. the run's "
            "length; 0 keeps it constant."
        ),
    )
    ppo_gamma: float = field(
        default=0.98,
        metadata=doc("Per-step discount of PPO."),
    )
    gae_lambda: float = field(
        default=0.8,
        metadata=doc("GAE's λ: 0 is the one-step TD error, 1 the Monte Carlo return."),
    )
    clip_range: float = field(
        default=0.2,
        metadata=doc(
            "ε of the clipped objective: the probability ratio is kept within [1 − ε, 1 + ε]."
        ),
    )
    value_clip: float | None = field(
        default=None,
        metadata=doc(
            "Clip the value function's change per update to this (PPO2's value clipping); none "
            "for off."
        ),
    )
    value_coef: float = field(
        default=0.5,
        metadata=doc("Weight of the value loss."),
    )
    entropy_coef: float = field(
        default=0.0,
        metadata=doc("Weight of the entropy bonus."),
    )
    normalize_advantages: bool = field(
        default=True,
        metadata=doc("Normalise advantages to mean 0, std 1 within each minibatch."),
    )
    max_grad_norm: float | None = field(
        default=0.5,
        metadata=doc("Clip the global gradient norm to this; none to not clip."),
    )
    ppo_hidden: tuple[int, ...] = field(
        default=(64, 64),
        metadata=doc("Hidden widths of PPO's policy and value MLPs (tanh)."),
    )
    log_std_init: float = field(
        default=0.0,
        metadata=doc("Box actions: initial log standard deviation of the Gaussian policy."),
    )
    device: str = field(
        default="auto",
        metadata=doc('"auto" (CUDA when present, else CPU), "cpu", "cuda" or "cuda:N".'),
    )
    amp: Amp = field(
        default="auto",
        metadata=doc(
            'bfloat16 autocast of the forward passes: "auto" on CUDA only, "on" on any device, '
            '"off".'
        ),
    )
    seed: int = field(
        default=0,
        metadata=doc("Seeds the network's initialisation and the minibatch order."),
    )

    def __post_init__(self) -> None:
        at_least_one = {
            "rollout_steps": self.rollout_steps,
            "epochs": self.epochs,
            "minibatch_size": self.minibatch_size,
        }
        for name, value in at_least_one.items():
            if value < 1:
                raise ValueError(f"PPOConfig.{name} must be at least 1, got {value}")
        if not self.ppo_lr > 0:
            raise ValueError(f"PPOConfig.ppo_lr must be > 0, got {self.ppo_lr}")
        if self.anneal_steps < 0:
            raise ValueError(f"PPOConfig.anneal_steps must be >= 0, got {self.anneal_steps}")
        for name, unit in (("ppo_gamma", self.ppo_gamma), ("gae_lambda", self.gae_lambda)):
            if not 0.0 <= unit <= 1.0:
                raise ValueError(f"PPOConfig.{name} must lie in [0, 1], got {unit}")
        if not self.clip_range > 0:
            raise ValueError(f"PPOConfig.clip_range must be > 0, got {self.clip_range}")
        for name, bound in (("value_clip", self.value_clip), ("max_grad_norm", self.max_grad_norm)):
            if bound is not None and not bound > 0:
                raise ValueError(f"PPOConfig.{name} must be > 0 or None, got {bound}")
        for name, coef in (("value_coef", self.value_coef), ("entropy_coef", self.entropy_coef)):
            if coef < 0:
                raise ValueError(f"PPOConfig.{name} must be >= 0, got {coef}")
        if any(width < 1 for width in self.ppo_hidden):
            raise ValueError(f"PPOConfig.ppo_hidden widths must be >= 1, got {self.ppo_hidden}")
        if self.amp not in ("auto", "on", "off"):
            raise ValueError(f'PPOConfig.amp must be "auto", "on" or "off", got {self.amp!r}')


def gae(
    reward: np.ndarray,
    value: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    *,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages Â_t and value targets Â_t + V(s_t), both [T, E] float32.

    δ_t = r_t + γ·V(s_{t+1})·(1 − terminated_t) − V(s_t)
    Â_t = δ_t + γλ·(1 − ended_t)·Â_{t+1},   ended = terminated or truncated
    `value` is [T + 1, E] and value[t + 1] is V of what step t returned: the
    next state, or the final observation where an episode ended
    (fedrl.client.training.rollout). A terminated episode bootstraps from
    nothing; a truncated one from V(final observation); either way no trace
    runs on into the next episode.
    """
    steps = reward.shape[0]
    advantages = np.zeros(reward.shape, dtype=np.float32)
    running = np.zeros(reward.shape[1:], dtype=np.float32)
    for t in reversed(range(steps)):
        next_value = value[t + 1] * ~terminated[t]
        delta = reward[t] + gamma * next_value - value[t]
        running = delta + gamma * lam * ~(terminated[t] | truncated[t]) * running
        advantages[t] = running
    return advantages, advantages + value[:steps]


@dataclass(frozen=True)
class LossParts:
    """The loss to minimise and what it is made of (the parts detached)."""

    loss: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor


def ppo_loss(  # noqa: PLR0917 (the contract keeps the paper's terms in order)
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    value: torch.Tensor,
    old_value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor | None,
    *,
    clip_range: float,
    value_clip: float | None,
    value_coef: float,
    entropy_coef: float,
) -> LossParts:
    """L = −L^CLIP + c1·L^VF − c2·S (PPO eq. 9), every term a mean over the minibatch.

    L^CLIP = E[min(r·Â, clip(r, 1 − ε, 1 + ε)·Â)],  r = π(a|s) / π_old(a|s)   (eq. 7)
    L^VF   = E[½ (V(s) − V_target)²], or with `value_clip` the larger of that
             and the loss of V_old + clip(V − V_old, −c, c) (PPO2's baselines code)
    S      = E[entropy of π(·|s)]; None when c2 is 0, as it then adds nothing
    """
    ratio = (log_prob - old_log_prob).exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_range, 1.0 + clip_range) * advantages
    policy_loss = -torch.minimum(unclipped, clipped).mean()
    value_error = (value - returns).square()
    if value_clip is not None:
        moved = old_value + (value - old_value).clamp(-value_clip, value_clip)
        value_error = torch.maximum(value_error, (moved - returns).square())
    value_loss = 0.5 * value_error.mean()
    loss = policy_loss + value_coef * value_loss
    if entropy is not None:
        loss = loss - entropy_coef * entropy.mean()
    return LossParts(loss=loss, policy_loss=policy_loss.detach(), value_loss=value_loss.detach())


@torch.no_grad()
def ratio_diagnostics(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, *, clip_range: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """How far the policy moved: approximate KL and the share of clipped ratios.

    KL(π_old ‖ π) ≈ E[(r − 1) − log r] (Schulman 2020, "Approximating KL
    divergence"): never negative, and unbiased.
    """
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    approx_kl = ((ratio - 1.0) - log_ratio).mean()
    clip_fraction = ((ratio - 1.0).abs() > clip_range).float().mean()
    return approx_kl, clip_fraction


class PPOLearner:
    """Owns the actor-critic and its optimizer; learns from one rollout at a time.

    Not thread-safe: the owner calls train between collections.
    """

    def __init__(
        self,
        *,
        obs_shape: tuple[int, ...],
        shape: EnvShape,
        config: PPOConfig,
        network: NetworkConfig,
        gradients: GradientSync | None = None,
    ) -> None:
        """`gradients` makes this learner one rank of several
        (fedrl.client.training.distributed): every step then uses the ranks'
        mean gradient, and an update takes as many minibatches as the rank
        with the fewest valid samples can fill."""
        self.config = config
        self._gradients = gradients
        self.obs_shape = tuple(obs_shape)
        # Images stay uint8 up to the network, which scales them on the device.
        self.obs_dtype = np.dtype(np.uint8 if is_image(self.obs_shape) else np.float32)
        self.shape = shape
        self.action_shape: tuple[int, ...] = () if shape.discrete else (shape.action_dim,)
        self.device = resolve_device(config.device)
        self._amp = config.amp == "on" or (config.amp == "auto" and self.device.type == "cuda")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            net = build_actor_critic(
                self.obs_shape,
                shape,
                hidden=config.ppo_hidden,
                network=network,
                log_std_init=config.log_std_init,
            )
        self.net: ActorCritic = net.to(self.device)
        # eps 1e-5 rather than Adam's 1e-8: the PPO paper's code; a tiny eps
        # lets near-zero second moments blow single steps up.
        self.optimizer = torch.optim.Adam(
            self.net.parameters(), lr=config.ppo_lr, eps=1e-5, fused=True
        )
        self._rng = np.random.default_rng(config.seed)
        self.updates = 0
        """Gradient steps so far."""
        self.rounds = 0
        """Rollouts learned from so far (one PPO update each)."""
        self.env_steps = 0
        """Valid steps of the rollouts learned from: the clock of the learning-rate schedule."""

    @property
    def online(self) -> nn.Module:
        """The network whose weights are the model (named like the DQN learner's)."""
        return self.net

    def learning_rate(self) -> float:
        """The rate now: linear from ppo_lr to 0 over anneal_steps env steps, or constant."""
        horizon = self.config.anneal_steps
        if not horizon:
            return self.config.ppo_lr
        return self.config.ppo_lr * max(0.0, 1.0 - self.env_steps / horizon)

    def train(self, rollout: Rollout) -> dict[str, float]:
        """One PPO update: `epochs` passes of minibatch steps over the rollout's valid steps."""
        rollout.validate(self.obs_shape, self.action_shape, self.obs_dtype)
        if not rollout.valid.any():
            raise ValueError("the rollout holds no valid step to learn from")
        c = self.config
        advantages, returns = gae(
            rollout.reward,
            rollout.value,
            rollout.terminated,
            rollout.truncated,
            gamma=c.ppo_gamma,
            lam=c.gae_lambda,
        )
        keep = rollout.valid.reshape(-1)
        columns = {
            "obs": rollout.obs.reshape(-1, *self.obs_shape)[keep],
            "action": rollout.action.reshape(-1, *self.action_shape)[keep],
            "old_log_prob": rollout.log_prob.reshape(-1)[keep],
            "old_value": rollout.value[:-1].reshape(-1)[keep],
            "advantages": advantages.reshape(-1)[keep],
            "returns": returns.reshape(-1)[keep],
        }
        data = {name: torch.from_numpy(array).to(self.device) for name, array in columns.items()}
        samples = int(keep.sum())
        rate = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = rate

        # The figures describe the last epoch: where the update ended up, and
        # measuring them on every step would cost a sixth of the update.
        sums = torch.zeros(6, device=self.device)
        minibatches = max(1, -(-samples // c.minibatch_size))
        if self._gradients is not None:
            # Every rank must take the same number of steps, each one collective.
            minibatches = self._gradients.fewest(minibatches)
        for epoch in range(c.epochs):
            order = self._rng.permutation(samples)
            for chunk in np.array_split(order, minibatches):
                index = torch.from_numpy(chunk).to(self.device)
                figures = self._step(
                    {name: column[index] for name, column in data.items()},
                    record=epoch == c.epochs - 1,
                )
                if figures is not None:
                    sums += figures
        self.updates += c.epochs * minibatches
        self.rounds += 1
        self.env_steps += samples
        loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction = (
            sums / minibatches
        ).tolist()
        if not np.isfinite(loss):
            raise FloatingPointError(
                f"the PPO update diverged (non-finite loss after {self.updates} steps); "
                "lower ppo_lr, or set max_grad_norm"
            )
        return {
            "loss": loss,
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "approx_kl": approx_kl,
            "clip_fraction": clip_fraction,
            "explained_variance": _explained_variance(columns["old_value"], columns["returns"]),
            "lr": rate,
            "updates": float(self.updates),
        }

    def _step(self, batch: dict[str, torch.Tensor], *, record: bool) -> torch.Tensor | None:
        """One gradient step; with `record`, its loss, parts, entropy, KL and clip share."""
        c = self.config
        advantages = batch["advantages"]
        if c.normalize_advantages and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        # bf16 matmuls, float32 losses: a log-ratio is a small difference of
        # log-probabilities that bf16's 8-bit mantissa would round away.
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._amp):
            params, value = self.net(batch["obs"])
        params = params.float()
        entropy = None
        if c.entropy_coef > 0:
            log_prob, entropy = self.net.log_prob_entropy(params, batch["action"])
        else:
            log_prob = self.net.log_prob(params, batch["action"])
        parts = ppo_loss(
            log_prob,
            batch["old_log_prob"],
            advantages,
            value.float(),
            batch["old_value"],
            batch["returns"],
            entropy,
            clip_range=c.clip_range,
            value_clip=c.value_clip,
            value_coef=c.value_coef,
            entropy_coef=c.entropy_coef,
        )
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(parts.loss)
        if self._gradients is not None:
            self._gradients.average_gradients(self.net.parameters())
        if c.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.net.parameters(), c.max_grad_norm, foreach=True)
        self.optimizer.step()
        if not record:
            return None
        with torch.no_grad():
            if entropy is None:
                _, entropy = self.net.log_prob_entropy(params, batch["action"])
            approx_kl, clip_fraction = ratio_diagnostics(
                log_prob, batch["old_log_prob"], clip_range=c.clip_range
            )
            return torch.stack(
                [
                    parts.loss.detach(),
                    parts.policy_loss,
                    parts.value_loss,
                    entropy.mean(),
                    approx_kl,
                    clip_fraction,
                ]
            )

    def reconfigure(self, config: PPOConfig) -> None:
        """Take new values of the knobs a running learner can change (population-based training).

        Each is read afresh by the next update; any other field must stay.
        """
        refuse_fixed_changes(self.config, config, RECONFIGURABLE, algorithm="PPO")
        self.config = config

    def reset_optimizer(self) -> None:
        """Forget Adam's moments and step counts, e.g. after copying another member's weights."""
        self.optimizer.state.clear()

    # -- weights and state --------------------------------------------------

    def weights(self) -> list[tuple[str, np.ndarray]]:
        """The actor-critic as named float32 CPU arrays (for actors and federation)."""
        return named_arrays(self.net)

    def set_weights(self, arrays: Sequence[tuple[str, np.ndarray]]) -> None:
        """Adopt a model (e.g. the newest global one); strict about names and shapes.

        Adam's moments are kept: they describe the loss surface, which a
        nearby model shares.
        """
        load_named_arrays(self.net, arrays)

    def state_dict(self) -> dict[str, Any]:
        """Network, optimizer, counters and the minibatch order's RNG, all on CPU.

        Loadable with ``torch.load(weights_only=True)``; with it a resumed run
        continues the same learning-rate schedule and minibatch order.
        """
        return {
            "format": STATE_FORMAT,
            "algorithm": "ppo",
            "net": to_cpu(self.net.state_dict()),
            "optimizer": to_cpu(self.optimizer.state_dict()),
            "updates": self.updates,
            "rounds": self.rounds,
            "env_steps": self.env_steps,
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict saved; ValueError (changing nothing) if it is not one."""
        missing = {"format", "algorithm", "net", "optimizer", "updates", "rounds", "env_steps"}
        missing -= set(state)
        if missing:
            raise ValueError(
                f"learner state is missing {sorted(missing)}"
                + (" (it is a DQN learner's: use --algo dqn)" if "online" in state else "")
            )
        if state["format"] != STATE_FORMAT or state["algorithm"] != "ppo":
            raise ValueError(
                f"learner state is {state['algorithm']!r} format {state['format']}, "
                f"expected 'ppo' format {STATE_FORMAT}"
            )
        expected = {name: tuple(t.shape) for name, t in self.net.state_dict().items()}
        got = {name: tuple(t.shape) for name, t in state["net"].items()}
        if expected != got:
            differing = sorted(set(expected.items()) ^ set(got.items()))
            raise ValueError(f"learner state's network does not fit this one: {differing[:4]}")
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError) as error:
            raise ValueError(
                f"learner state's optimizer does not fit this network: {error}"
            ) from error
        self.net.load_state_dict(state["net"])
        self.updates = int(state["updates"])
        self.rounds = int(state["rounds"])
        self.env_steps = int(state["env_steps"])
        if isinstance(state.get("rng"), dict):
            self._rng.bit_generator.state = state["rng"]


def _explained_variance(predicted: np.ndarray, target: np.ndarray) -> float:
    """1 − Var[target − predicted] / Var[target]: 1 is a perfect value function, ≤ 0 none."""
    spread = float(np.var(target))
    return float("nan") if spread == 0 else 1.0 - float(np.var(target - predicted)) / spread
