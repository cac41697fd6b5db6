"""PPO's math against hand-computed values and torch.distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrl.client.training.policy_network import (
    categorical_entropy,
    categorical_log_prob,
    gaussian_entropy,
    gaussian_log_prob,
)
from fedrl.client.training.ppo_learner import PPOConfig, gae, ppo_loss, ratio_diagnostics


def test_gae_cuts_at_termination_and_bootstraps_a_truncation_from_the_final_value() -> None:
    # prepare: two envs, gamma = lambda = 0.5. Env 0 terminates at t=1, env 1
    # is truncated at t=1; t=2 is their autoreset step, whose value is
    # V(final observation): 9.0 (never used: nothing after a termination) and
    # 2.0 (the truncated episode's bootstrap).
    reward = np.array([[1, 1], [2, 2], [0, 0], [4, 4]], dtype=np.float32)
    value = np.array([[0.5, 0.5], [1.0, 1.0], [9.0, 2.0], [1.5, 1.5], [2.0, 2.0]], np.float32)
    terminated = np.array([[0, 0], [1, 0], [0, 0], [0, 0]], dtype=bool)
    truncated = np.array([[0, 0], [0, 1], [0, 0], [0, 0]], dtype=bool)

    # act
    advantages, returns = gae(reward, value, terminated, truncated, gamma=0.5, lam=0.5)

    # assert, by hand (gamma * lambda = 0.25):
    # t=3: delta = 4 + 0.5*2.0 - 1.5 = 3.5 (both envs)
    # t=2: env 0: 0 + 0.5*1.5 - 9.0 + 0.25*3.5 = -7.375; env 1: 0 + 0.75 - 2.0 + 0.875 = -0.375
    # t=1: env 0 terminated: 2 - 1.0 = 1.0; env 1 truncated: 2 + 0.5*2.0 - 1.0 = 2.0 (cut)
    # t=0: env 0: 1 + 0.5*1.0 - 0.5 + 0.25*1.0 = 1.25; env 1: 1.0 + 0.25*2.0 = 1.5
    expected = np.array([[1.25, 1.5], [1.0, 2.0], [-7.375, -0.375], [3.5, 3.5]], np.float32)
    np.testing.assert_allclose(advantages, expected, rtol=1e-6)
    np.testing.assert_allclose(returns, expected + value[:4], rtol=1e-6)


def test_gae_with_lambda_one_is_the_discounted_return_minus_the_value() -> None:
    rng = np.random.default_rng(0)
    reward = rng.standard_normal((6, 1)).astype(np.float32)
    value = rng.standard_normal((7, 1)).astype(np.float32)
    none = np.zeros((6, 1), dtype=bool)

    advantages, returns = gae(reward, value, none, none, gamma=0.9, lam=1.0)

    discounted = [
        sum(0.9**k * reward[t + k, 0] for k in range(6 - t)) + 0.9 ** (6 - t) * value[6, 0]
        for t in range(6)
    ]
    np.testing.assert_allclose(returns[:, 0], discounted, rtol=1e-5)
    np.testing.assert_allclose(advantages[:, 0], np.array(discounted) - value[:6, 0], rtol=1e-5)


def test_clipped_loss_matches_hand_values() -> None:
    # prepare: ratios 1.2, 0.6, 1.0 against pi_old = 0.5, eps = 0.1
    old = torch.full((3,), math.log(0.5))
    new = torch.log(torch.tensor([0.6, 0.3, 0.5]))
    advantages = torch.tensor([1.0, -1.0, 2.0])
    value, old_value, returns = (
        torch.tensor([1.0, 2.0, 3.0]),
        torch.tensor([0.0, 2.0, 2.0]),
        torch.tensor([2.0, 2.0, 2.0]),
    )
    entropy = torch.tensor([0.3, 0.6, 0.9])

    # act
    parts = ppo_loss(
        new,
        old,
        advantages,
        value,
        old_value,
        returns,
        entropy,
        clip_range=0.1,
        value_clip=None,
        value_coef=0.5,
        entropy_coef=0.01,
    )
    clipped_value = ppo_loss(
        new,
        old,
        advantages,
        value,
        old_value,
        returns,
        entropy,
        clip_range=0.1,
        value_clip=0.5,
        value_coef=0.5,
        entropy_coef=0.01,
    )

    # assert: min(r*A, clip(r)*A) = 1.1, -0.9, 2.0 -> L^CLIP = 2.2 / 3
    assert parts.policy_loss.item() == pytest.approx(-2.2 / 3, rel=1e-6)
    # 0.5 * mean((V - R)^2) = 0.5 * (1 + 0 + 1) / 3
    assert parts.value_loss.item() == pytest.approx(1 / 3, rel=1e-6)
    # mean entropy 0.6, weighted 0.01
    assert parts.loss.item() == pytest.approx(-2.2 / 3 + 0.5 / 3 - 0.006, rel=1e-6)
    # V_old + clip(V - V_old, -0.5, 0.5) = 0.5, 2, 2.5: errors max(1, 2.25), 0, max(1, 0.25)
    assert clipped_value.value_loss.item() == pytest.approx(0.5 * 3.25 / 3, rel=1e-6)


def test_ratio_diagnostics_match_hand_values() -> None:
    old = torch.full((3,), math.log(0.5))
    new = torch.log(torch.tensor([0.6, 0.3, 0.5]))

    approx_kl, clip_fraction = ratio_diagnostics(new, old, clip_range=0.1)

    # |r - 1| = 0.2, 0.4, 0 against 0.1; KL ~ mean((r - 1) - log r)
    assert clip_fraction.item() == pytest.approx(2 / 3)
    kl = np.mean([0.2 - math.log(1.2), -0.4 - math.log(0.6), 0.0])
    assert approx_kl.item() == pytest.approx(kl, rel=1e-5)


def test_the_clipped_objective_gives_no_gradient_past_the_clip() -> None:
    # A ratio already above 1 + eps with a positive advantage: nothing to gain.
    old = torch.zeros(1)
    new = torch.tensor([math.log(1.5)], requires_grad=True)
    parts = ppo_loss(
        new,
        old,
        torch.ones(1),
        torch.zeros(1),
        torch.zeros(1),
        torch.zeros(1),
        None,
        clip_range=0.2,
        value_clip=None,
        value_coef=0.0,
        entropy_coef=0.0,
    )

    parts.loss.backward()

    assert new.grad is not None and new.grad.item() == 0.0


def test_gaussian_log_probabilities_and_entropy_match_torch_distributions() -> None:
    torch.manual_seed(0)
    mean = torch.randn(5, 3)
    log_std = torch.randn(3) * 0.5
    action = mean + torch.randn(5, 3) * 2
    reference = torch.distributions.Normal(mean, log_std.exp())

    torch.testing.assert_close(
        gaussian_log_prob(mean, log_std, action), reference.log_prob(action).sum(dim=-1)
    )
    torch.testing.assert_close(gaussian_entropy(log_std, 5), reference.entropy().sum(dim=-1))


def test_categorical_log_probabilities_and_entropy_match_torch_distributions() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 4) * 3
    action = torch.randint(0, 4, (6,))
    reference = torch.distributions.Categorical(logits=logits)

    torch.testing.assert_close(categorical_log_prob(logits, action), reference.log_prob(action))
    torch.testing.assert_close(categorical_entropy(logits), reference.entropy())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rollout_steps", 0),
        ("minibatch_size", 0),
        ("ppo_gamma", 1.5),
        ("clip_range", 0.0),
        ("value_clip", -1.0),
        ("ppo_hidden", (0,)),
        ("amp", "bf16"),
    ],
)
def test_a_bad_knob_is_refused_with_its_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"PPOConfig.{field}"):
        PPOConfig(**{field: value})  # type: ignore[arg-type]
