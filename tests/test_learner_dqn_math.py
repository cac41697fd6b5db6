"""dqn_loss against targets and losses computed by hand."""

from __future__ import annotations

import pytest
import torch

from fedrl.client.training.learner import dqn_loss

# Two transitions, two actions. Hand-computed below:
#   Q(s, a) taken:          row 0 action 0 -> 0.5, row 1 action 1 -> 3.0
#   Double DQN:  a* = argmax online(s') = [1, 0]  ->  target(s', a*) = [20, 30]
#   plain DQN:   max_a target(s', a)               = [20, 40]
Q_ONLINE = [[0.5, 1.0], [2.0, 3.0]]
Q_ONLINE_NEXT = [[1.0, 3.0], [2.0, 0.0]]
Q_TARGET_NEXT = [[10.0, 20.0], [30.0, 40.0]]
ACTIONS = [0, 1]
REWARDS = [1.0, -1.0]
DISCOUNTS = [0.9, 0.5]


def _loss(
    *,
    double: bool,
    huber_delta: float | None = None,
    discounts: list[float] = DISCOUNTS,
    weights: list[float] | None = None,
    q_online: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return dqn_loss(
        torch.tensor(Q_ONLINE) if q_online is None else q_online,
        torch.tensor(Q_ONLINE_NEXT),
        torch.tensor(Q_TARGET_NEXT),
        torch.tensor(ACTIONS),
        torch.tensor(REWARDS),
        torch.tensor(discounts),
        torch.tensor([1.0, 1.0] if weights is None else weights),
        double=double,
        huber_delta=huber_delta,
    )


def test_double_dqn_values_the_online_argmax_with_the_target_network() -> None:
    loss, td_abs = _loss(double=True)

    # y = r + d * target(s', argmax online(s')) = [1 + 0.9*20, -1 + 0.5*30] = [19, 14]
    assert td_abs.tolist() == pytest.approx([19.0 - 0.5, 14.0 - 3.0])
    assert loss.item() == pytest.approx(0.5 * (18.5**2 + 11.0**2) / 2)


def test_plain_dqn_bootstraps_from_the_target_networks_max() -> None:
    _, td_abs = _loss(double=False)

    # y = r + d * max target(s') = [1 + 0.9*20, -1 + 0.5*40] = [19, 19]
    assert td_abs.tolist() == pytest.approx([19.0 - 0.5, 19.0 - 3.0])


@pytest.mark.parametrize("double", [True, False])
def test_zero_discount_means_no_bootstrap_past_termination(double: bool) -> None:
    _, td_abs = _loss(double=double, discounts=[0.0, 0.0])

    # y = r: the next state's values (tens) play no part.
    assert td_abs.tolist() == pytest.approx([abs(1.0 - 0.5), abs(-1.0 - 3.0)])


def test_n_step_discount_is_applied_as_given() -> None:
    gamma = 0.99
    n_step_discount = gamma**3

    _, td_abs = _loss(double=True, discounts=[n_step_discount, n_step_discount])

    assert td_abs.tolist() == pytest.approx(
        [1.0 + n_step_discount * 20.0 - 0.5, -1.0 + n_step_discount * 30.0 - 3.0]
    )


def test_huber_is_quadratic_inside_delta_and_linear_outside() -> None:
    # Row 0's TD error is 0.5 (inside delta 1), row 1's is 4.0 (outside).
    q_online = torch.tensor([[0.5, 0.0], [0.0, 3.0]])

    loss, _ = _loss(double=True, huber_delta=1.0, discounts=[0.0, 0.0], q_online=q_online)

    inside = 0.5 * 0.5**2
    outside = 1.0 * (4.0 - 0.5 * 1.0)
    assert loss.item() == pytest.approx((inside + outside) / 2)


def test_importance_weights_scale_each_samples_loss() -> None:
    loss, _ = _loss(double=True, weights=[1.0, 0.0])

    assert loss.item() == pytest.approx(0.5 * 18.5**2 / 2)


def test_gradient_reaches_only_the_taken_actions_online_values() -> None:
    q_online = torch.tensor(Q_ONLINE, requires_grad=True)

    loss, _ = _loss(double=True, q_online=q_online)
    torch.autograd.backward(loss)

    # d/dQ of mean(0.5 * (y - Q)^2) = -(y - Q) / B at the taken actions, 0 elsewhere.
    assert q_online.grad is not None
    assert q_online.grad.flatten().tolist() == pytest.approx([-18.5 / 2, 0.0, 0.0, -11.0 / 2])


def test_double_dqn_without_online_next_values_says_what_is_missing() -> None:
    with pytest.raises(ValueError, match="Double DQN needs"):
        dqn_loss(
            torch.tensor(Q_ONLINE),
            None,
            torch.tensor(Q_TARGET_NEXT),
            torch.tensor(ACTIONS),
            torch.tensor(REWARDS),
            torch.tensor(DISCOUNTS),
            torch.ones(2),
            double=True,
            huber_delta=None,
        )
