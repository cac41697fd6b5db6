"""Two-player games as single-agent envs: rules, fixed players, the adapter over PettingZoo."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrl.client.training.vector_env import env_shape, make_vector_env
from fedrl.envs.board_games import (
    GAMES,
    game_rules,
    lookahead_player,
    random_legal,
)
from fedrl.envs.two_player import (
    BASELINE_IDS,
    Baseline,
    TwoPlayerVectorEnv,
    make_game,
)

pettingzoo = pytest.importorskip("pettingzoo")

CONNECT_FOUR = "pettingzoo/connect_four_v3"
TICTACTOE = "pettingzoo/tictactoe_v3"


def legal_or_reset(obs: np.ndarray, cells: int) -> np.ndarray:
    """The observations' legal moves; a finished game (empty mask) may play anything."""
    legal = obs[:, 2 * cells :] > 0.5
    legal[~legal.any(axis=1), 0] = True
    return legal


def test_winning_lines_are_the_games_own() -> None:
    assert GAMES["connect_four_v3"].lines.shape == (69, 4)
    assert GAMES["tictactoe_v3"].lines.shape == (8, 3)


def test_an_unknown_game_is_refused_with_the_games_there_are() -> None:
    with pytest.raises(ValueError, match="connect_four_v3"):
        game_rules("pettingzoo/chess_v6")


def test_connect_four_pieces_fall_to_the_lowest_empty_cell() -> None:
    rules = GAMES["connect_four_v3"]
    occupied = np.zeros((1, rules.cells), dtype=np.bool_)
    occupied[0, 5 * 7 + 3] = True  # bottom row, column 3
    occupied[0, [r * 7 + 6 for r in range(6)]] = True  # column 6 full
    target = rules.target_cells(occupied)[0]
    assert target[0] == 5 * 7
    assert target[3] == 4 * 7 + 3
    assert target[6] == -1


def test_lookahead_takes_a_win_before_a_block() -> None:
    rules = GAMES["tictactoe_v3"]
    own = np.zeros(9, dtype=np.bool_)
    other = np.zeros(9, dtype=np.bool_)
    own[[0, 1]] = True  # wins at 2
    other[[3, 4]] = True  # would win at 5
    obs = np.concatenate([np.stack([own, other], axis=1).reshape(-1), ~(own | other)])
    obs = obs.astype(np.float32)[None]
    legal = obs[:, 18:] > 0.5
    move = lookahead_player(rules)(obs, legal, np.random.default_rng(0))
    assert move.tolist() == [2]
    own[:] = False
    own[[0, 8]] = True
    obs = np.concatenate([np.stack([own, other], axis=1).reshape(-1), ~(own | other)])
    obs = obs.astype(np.float32)[None]
    move = lookahead_player(rules)(obs, obs[:, 18:] > 0.5, np.random.default_rng(0))
    assert move.tolist() == [5]


def test_the_learner_sees_the_board_from_its_side_and_its_outcome_is_pettingzoos() -> None:
    env = TwoPlayerVectorEnv(TICTACTOE, 2, seats=[0, 1])
    obs, info = env.reset(seed=3)
    # Seat 1: the opponent has moved once; its piece is in the second plane.
    planes = obs[:, :18].reshape(2, 9, 2)
    assert planes[0].sum() == 0
    assert planes[1, :, 0].sum() == 0 and planes[1, :, 1].sum() == 1
    assert info["seat"].tolist() == [0, 1]
    rng = np.random.default_rng(0)
    outcomes: list[float] = []
    for _ in range(40):
        obs, reward, terminated, truncated, info = env.step(
            random_legal(legal_or_reset(obs, 9), rng)
        )
        assert not truncated.any()
        outcomes += reward[terminated].tolist()
        assert set(reward[~terminated].tolist()) <= {0.0}
        # A finished game's final observation has no legal move left.
        assert not obs[terminated, 18:].any()
    assert outcomes and set(outcomes) <= {-1.0, 0.0, 1.0}


class FirstLegal(Baseline):
    """Plays the lowest legal action."""

    def act(self, opponent, obs, legal, rng):  # type: ignore[no-untyped-def]
        return np.argmax(legal, axis=1).astype(np.int64)


def test_an_illegal_move_is_refused_and_nothing_moves() -> None:
    env = TwoPlayerVectorEnv(
        CONNECT_FOUR, 1, seats=[0], opponents=FirstLegal(GAMES["connect_four_v3"])
    )
    obs, _ = env.reset(seed=0)
    for _ in range(3):  # column 0 fills with alternating pieces: nobody wins
        obs, _, terminated, _, _ = env.step(np.array([0]))
        assert not terminated[0]
    before = obs.copy()
    assert obs[0, 84] == 0.0
    with pytest.raises(ValueError, match="illegal move"):
        env.step(np.array([0]))
    with pytest.raises(ValueError, match="illegal move"):
        env.step(np.array([9]))
    after, *_ = env.step(np.array([1]))
    # The refused moves changed nothing: the legal one lands on the same board.
    assert after[0, :84].sum() == before[0, :84].sum() + 2


def test_make_vector_env_builds_games_with_a_mask_in_their_shape() -> None:
    env = make_vector_env(CONNECT_FOUR, 3)
    shape = env_shape(env)
    assert shape.action_mask and shape.n_actions == 7 and shape.obs_shape == (2 * 42 + 7,)
    with pytest.raises(ValueError, match="no --data"):
        make_vector_env(CONNECT_FOUR, 1, data="bars.csv")
    with pytest.raises(ValueError, match="no two-player game"):
        make_vector_env("CartPole-v1", 1, opponents=Baseline(GAMES["tictactoe_v3"]))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), game=st.sampled_from([CONNECT_FOUR, TICTACTOE]))
def test_every_move_of_either_player_is_legal_in_pettingzoos_own_env(seed: int, game: str) -> None:
    """The adapter's games replayed move by move on PettingZoo's wrapped env, which ends a game
    with a penalty at an illegal move: none is ever played, and outcomes agree."""
    rules = game_rules(game)
    recorded: list[int] = []

    class Recording(Baseline):
        def act(self, opponent, obs, legal, rng):  # type: ignore[no-untyped-def]
            move = super().act(opponent, obs, legal, rng)
            recorded.append(int(move[0]))
            return move

    env = TwoPlayerVectorEnv(game, 1, opponents=Recording(rules, "lookahead"))
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    moves = list(recorded)
    seat = int(info["seat"][0])
    while True:
        recorded.clear()
        action = random_legal(obs[:, 2 * rules.cells :] > 0.5, rng)
        obs, reward, terminated, _, _ = env.step(action)
        moves += [int(action[0]), *recorded]
        if terminated[0]:
            break
    wrapped = pettingzoo.make("aec", f"classic/{rules.name}")
    wrapped.reset()
    agents = list(wrapped.possible_agents)
    for move in moves:
        assert not any(wrapped.terminations.values())
        mask = wrapped.observe(wrapped.agent_selection)["action_mask"]
        assert mask[move] == 1
        wrapped.step(move)
    assert float(wrapped.rewards[agents[seat]]) == float(reward[0])


def test_baselines_have_fixed_ids_after_the_latest_policy() -> None:
    assert BASELINE_IDS == {"random": 1, "lookahead": 2}


def test_a_game_renders_rgb_frames() -> None:
    env = make_vector_env(TICTACTOE, 1, render=True)
    env.reset(seed=0)
    (frame,) = env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    assert make_game(GAMES["tictactoe_v3"]).render_mode is None
