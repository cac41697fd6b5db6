"""A board's symmetries: PettingZoo's own game, played in a symmetry, shows the transformed
observation; the learner trains on a position's images too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrl.client.training.device_replay import DeviceBatch
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.symmetry import BatchSymmetries
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.envs.board_games import GAMES
from fedrl.envs.two_player import make_game

pytest.importorskip("pettingzoo")


def observed(game: object, agent: str) -> np.ndarray:
    seen = game.observe(agent)  # type: ignore[attr-defined]
    return np.concatenate([seen["observation"].reshape(-1), seen["action_mask"]]).astype(np.float32)


def test_symmetries_are_the_identity_and_permutations() -> None:
    for rules in GAMES.values():
        features, actions = rules.symmetries
        assert (features[0] == np.arange(rules.obs_size)).all()
        assert (actions[0] == np.arange(rules.actions)).all()
        assert (np.sort(features, axis=1) == np.arange(rules.obs_size)).all()
        assert (np.sort(actions, axis=1) == np.arange(rules.actions)).all()
    assert len(GAMES["connect_four_v3"].symmetries[0]) == 2
    assert len(GAMES["tictactoe_v3"].symmetries[0]) == 8


@pytest.mark.parametrize("name", sorted(GAMES))
@settings(max_examples=25, deadline=None)
@given(choices=st.lists(st.integers(0, 10**6), max_size=42))
def test_a_game_played_in_a_symmetry_shows_the_transformed_observation(
    name: str, choices: list[int]
) -> None:
    """Legal moves picked by `choices`, played in the original game and, through each
    symmetry's action map, in another: every observation of the second is the first's
    observation with the symmetry's features, for both players."""
    rules = GAMES[name]
    features, actions = rules.symmetries
    for symmetry in range(len(features)):
        original, image = make_game(rules), make_game(rules)
        original.reset(seed=0)
        image.reset(seed=0)
        for choice in choices:
            mover = original.agent_selection
            if original.terminations[mover]:
                break
            legal = np.flatnonzero(original.observe(mover)["action_mask"])
            move = int(legal[choice % len(legal)])
            original.step(move)
            image.step(int(actions[symmetry, move]))
            for agent in original.possible_agents:
                seen, transformed = observed(original, agent), observed(image, agent)
                assert (transformed == seen[features[symmetry]]).all()


def test_a_batch_keeps_its_rewards_and_transforms_alike() -> None:
    rules = GAMES["tictactoe_v3"]
    symmetries = BatchSymmetries(
        *rules.symmetries,
        obs_features=rules.obs_size,
        n_actions=rules.actions,
        device=torch.device("cpu"),
    )
    obs = torch.rand(512, rules.obs_size)
    batch = DeviceBatch(
        obs=obs,
        action=torch.randint(rules.actions, (512,)),
        reward=torch.rand(512),
        next_obs=obs + 1.0,
        discount=torch.rand(512),
        weights=torch.rand(512),
    )
    out = symmetries.apply(batch)
    features, actions = (torch.as_tensor(t) for t in rules.symmetries)
    # Which symmetry each row took: the one whose gather reproduces it.
    for row in range(512):
        taken = [
            s
            for s in range(len(features))
            if torch.equal(out.obs[row], batch.obs[row, features[s]])
        ]
        assert len(taken) == 1
        assert torch.equal(out.next_obs[row], batch.next_obs[row, features[taken[0]]])
        assert out.action[row] == actions[taken[0], batch.action[row]]
    for same in ("reward", "discount", "weights"):
        assert torch.equal(getattr(out, same), getattr(batch, same))
    assert len({tuple(r.tolist()) for r in (out.obs - batch.obs != 0).int()}) > 4


def test_tables_that_do_not_fit_are_refused() -> None:
    rules = GAMES["connect_four_v3"]
    features, actions = rules.symmetries
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="do not fit observations"):
        BatchSymmetries(features, actions, obs_features=27, n_actions=7, device=cpu)
    with pytest.raises(ValueError, match="actions are"):
        BatchSymmetries(features, actions[:, :3], obs_features=91, n_actions=7, device=cpu)
    broken = features.copy()
    broken[1, 0] = broken[1, 1]
    with pytest.raises(ValueError, match="permutation"):
        BatchSymmetries(broken, actions, obs_features=91, n_actions=7, device=cpu)


@pytest.mark.parametrize("symmetries", [True, False])
def test_a_win_learned_on_one_side_is_learned_on_its_mirror_image(symmetries: bool) -> None:
    """One connect-four transition, a winning move in column 0, trained on alone: with the
    symmetries its mirror image (column 6) is worth the win too; without them it is not."""
    rules = GAMES["connect_four_v3"]
    features, actions = rules.symmetries
    learner = Learner(
        obs_shape=(rules.obs_size,),
        n_actions=rules.actions,
        config=LearnerConfig(
            hidden=(64,),
            batch_size=32,
            learning_starts=1,
            prioritized=False,
            lr=3e-3,
            device="cpu",
            symmetries=symmetries,
        ),
        action_mask=True,
        symmetries=rules.symmetries,
    )
    board = np.zeros((rules.rows, rules.cols, 2), dtype=np.float32)
    board[3:, 0, 0] = 1.0  # three own pieces in column 0
    board[3:, 1, 1] = 1.0
    obs = np.concatenate([board.reshape(-1), np.ones(rules.actions, dtype=np.float32)])
    final = np.zeros_like(obs)
    final[: 2 * rules.cells] = obs[: 2 * rules.cells]
    learner.add(
        LearnerTransitions(
            obs=obs[None],
            action=np.array([0], dtype=np.int64),
            reward=np.array([1.0], dtype=np.float32),
            next_obs=final[None],
            discount=np.array([0.0], dtype=np.float32),
        )
    )
    torch.manual_seed(0)
    learner.train(400)
    mirrored = obs[features[1]]
    with torch.no_grad():
        q = learner.online(torch.as_tensor(np.stack([obs, mirrored]))).numpy()
    assert q[0, 0] == pytest.approx(1.0, abs=0.1)
    if symmetries:
        assert q[1, actions[1, 0]] == pytest.approx(1.0, abs=0.1)
    else:
        assert abs(q[1, actions[1, 0]] - 1.0) > 0.3
