"""Illegal actions are masked where every network output is read, and are never played."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrl.client.training.exploration import epsilon_greedy
from fedrl.client.training.learner import dqn_loss
from fedrl.client.training.masking import MASKED, legal_actions
from fedrl.client.training.policy_network import build_actor_critic
from fedrl.client.training.q_network import DEFAULT_NETWORK, build_q_network
from fedrl.client.training.vector_env import EnvShape
from fedrl.envs.board_games import GAMES, random_legal

RULES = GAMES["connect_four_v3"]
OBS = (RULES.obs_size,)
SHAPE = EnvShape(obs_shape=OBS, n_actions=RULES.actions, action_mask=True)


def random_states(seed: int, count: int) -> np.ndarray:
    """Observations of boards reached by random legal play, from the mover's side."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        own = np.zeros(RULES.cells, dtype=np.bool_)
        other = np.zeros(RULES.cells, dtype=np.bool_)
        for _ in range(int(rng.integers(0, 40))):
            target = RULES.target_cells((own | other)[None])[0]
            legal = target >= 0
            if not legal.any():
                break
            cell = target[random_legal(legal[None], rng)[0]]
            own[cell] = True
            own, other = other, own
        legal = RULES.target_cells((own | other)[None])[0] >= 0
        planes = np.stack([own, other], axis=1).reshape(-1)
        rows.append(np.concatenate([planes, legal]).astype(np.float32))
    return np.stack(rows)


def illegal_favoured(net: torch.nn.Module) -> torch.nn.Module:
    """A network whose unmasked output would pick the illegal actions: large bias on each."""
    with torch.no_grad():
        for name, param in net.named_parameters():
            if name.endswith("bias") and param.shape == (RULES.actions,):
                param.copy_(torch.arange(RULES.actions, dtype=torch.float32) * 100.0)
    return net


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dueling=st.booleans(), eps=st.floats(0.0, 1.0))
def test_a_masked_q_network_and_its_exploration_never_choose_an_illegal_action(
    seed: int, dueling: bool, eps: float
) -> None:
    torch.manual_seed(seed)
    obs = random_states(seed, 16)
    legal = legal_actions(obs, RULES.actions)
    net = illegal_favoured(build_q_network(OBS, RULES.actions, dueling=dueling, action_mask=True))
    with torch.no_grad():
        q = net(torch.from_numpy(obs))
    greedy = q.argmax(dim=1).numpy()
    playable = legal.any(axis=1)
    assert legal[np.arange(len(obs)), greedy][playable].all()
    assert (q.numpy()[~legal] == MASKED).all()
    chosen = epsilon_greedy(
        greedy, np.full(len(obs), eps), RULES.actions, np.random.default_rng(seed), legal
    )
    assert legal[np.arange(len(obs)), chosen][playable].all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_a_masked_policy_never_samples_nor_picks_an_illegal_action(seed: int) -> None:
    torch.manual_seed(seed)
    obs = torch.from_numpy(random_states(seed, 16))
    legal = legal_actions(obs.numpy(), RULES.actions)
    net = illegal_favoured(build_actor_critic(OBS, SHAPE, hidden=(32,), network=DEFAULT_NETWORK))
    with torch.no_grad():
        logits, _ = net(obs)
        sampled = net.sample(logits, torch.Generator().manual_seed(seed)).numpy()
        greedy = net.greedy(obs).numpy()
        entropy = net.log_prob_entropy(logits, torch.from_numpy(sampled))[1]
    playable = legal.any(axis=1)
    rows = np.arange(len(sampled))
    assert legal[rows, sampled][playable].all()
    assert legal[rows, greedy][playable].all()
    assert torch.isfinite(entropy).all()


def test_the_target_max_and_the_double_dqn_argmax_see_legal_actions_only() -> None:
    """Hand-computed: action 1 is illegal in the next state, with the largest raw values."""
    q_online = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    q_next_online = torch.tensor([[0.5, MASKED, 0.2]])
    q_next_target = torch.tensor([[0.4, MASKED, 0.9]])
    action = torch.tensor([0])
    reward = torch.tensor([1.0])
    discount = torch.tensor([0.5])
    weights = torch.ones(1)
    for double, bootstrap in ((False, 0.9), (True, 0.4)):
        _, td = dqn_loss(
            q_online,
            q_next_online,
            q_next_target,
            action,
            reward,
            discount,
            weights,
            double=double,
            huber_delta=None,
        )
        assert td.item() == pytest.approx(0.5 * bootstrap)


def test_a_terminal_state_without_legal_actions_bootstraps_nothing_and_stays_finite() -> None:
    q_online = torch.tensor([[1.0, 2.0]], requires_grad=True)
    masked = torch.full((1, 2), MASKED)
    loss, td = dqn_loss(
        q_online,
        masked,
        masked,
        torch.tensor([1]),
        torch.tensor([-1.0]),
        torch.tensor([0.0]),
        torch.ones(1),
        double=True,
        huber_delta=1.0,
    )
    assert td.item() == 3.0 and torch.isfinite(loss)
