"""The league: Elo, prioritised fictitious self-play, bounded pools, and what actors hold."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrl.client.training.elo import expected_score, updated
from fedrl.client.training.league import League
from fedrl.client.training.opponent_board import board_layout, publish, read
from fedrl.client.training.opponent_pool import OpponentPool, OpponentsSpec
from fedrl.client.training.q_network import build_q_network, named_arrays
from fedrl.client.training.self_play import SelfPlay
from fedrl.client.training.self_play_config import SelfPlayConfig
from fedrl.client.training.shm import WeightsBoard
from fedrl.envs.board_games import GAMES
from fedrl.envs.two_player import BASELINE_IDS, LATEST, NO_OPPONENT, TwoPlayerVectorEnv

RULES = GAMES["tictactoe_v3"]
OBS = (RULES.obs_size,)
RANDOM, LOOKAHEAD = BASELINE_IDS["random"], BASELINE_IDS["lookahead"]


def network(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_q_network(OBS, RULES.actions, hidden=(16,), action_mask=True)


def test_elo_on_hand_computed_values() -> None:
    assert expected_score(1400.0, 1000.0) == pytest.approx(10 / 11)
    assert expected_score(0.0, 0.0) == 0.5
    # An even game won moves a rating by K/2.
    assert updated(0.0, 0.0, 1.0, k=16.0) == 8.0
    assert updated(0.0, 0.0, 0.5, k=16.0) == 0.0


def test_games_move_the_learner_and_its_opponent_but_never_the_anchor() -> None:
    league = League(SelfPlayConfig(), seed=0)
    snapshot = league.add_snapshot(named_arrays(network()), updates=10)
    league.record(
        np.array([RANDOM, snapshot, LATEST, NO_OPPONENT]), np.array([1.0, -1.0, 1.0, 9.0])
    )
    random = league.entries[RANDOM]
    assert random.rating == 0.0 and random.games == 1 and random.wins == 1
    learner, snap = league.learner, league.entries[snapshot]
    assert snap.rating > 0.0 and snap.losses == 1
    # Won against random (+8 from 0), then lost to the snapshot rated 0.
    assert learner.rating == pytest.approx(updated(8.0, 0.0, 0.0))
    assert league.entries[LATEST].games == 1  # counted, but rates nothing
    with pytest.raises(ValueError, match="in no league"):
        league.record(np.array([999]), np.array([1.0]))


def test_pfsp_fields_the_opponents_the_learner_beats_least_most() -> None:
    league = League(SelfPlayConfig(latest_share=0.25, opponent_slots=2), seed=0)
    weak = league.add_snapshot(named_arrays(network(1)), updates=1)
    strong = league.add_snapshot(named_arrays(network(2)), updates=2)
    league.record(np.array([weak] * 50 + [strong] * 50), np.array([1.0] * 50 + [-1.0] * 50))
    fielded = league.fielded()
    odds = dict(zip(fielded.ids, fielded.odds, strict=True))
    assert odds[strong] > odds[weak]
    ids, all_odds = fielded.table()
    assert all_odds.sum() == pytest.approx(1.0)
    assert dict(zip(ids.tolist(), all_odds.tolist(), strict=True))[LATEST] == 0.25


def test_the_networks_weigh_as_one_opponent_beside_each_fixed_player() -> None:
    league = League(SelfPlayConfig(latest_share=0.2, opponent_slots=8), seed=0)
    snapshots = [league.add_snapshot(named_arrays(network(i)), updates=i) for i in range(8)]
    # Even against the look-ahead player and every snapshot, always winning against random.
    league.record(np.array([RANDOM] * 50), np.array([1.0] * 50))
    league.record(np.array([LOOKAHEAD, LOOKAHEAD]), np.array([1.0, -1.0]))
    for snapshot in snapshots:
        league.record(np.array([snapshot, snapshot]), np.array([1.0, -1.0]))
    fielded = league.fielded()
    ids, odds = fielded.table()
    by_id = dict(zip(ids.tolist(), odds.tolist(), strict=True))
    assert by_id[LATEST] == pytest.approx(0.2)
    assert by_id[RANDOM] == pytest.approx(0.0)
    assert by_id[LOOKAHEAD] == pytest.approx(0.4)
    assert sum(fielded.odds) == pytest.approx(0.4)
    assert max(fielded.odds) == pytest.approx(min(fielded.odds))


def test_a_learner_that_beats_everyone_still_draws_every_opponent() -> None:
    league = League(SelfPlayConfig(latest_share=0.0), seed=0)
    snapshot = league.add_snapshot(named_arrays(network()), updates=1)
    league.record(np.array([RANDOM, LOOKAHEAD, snapshot] * 300), np.array([1.0] * 900))
    ids, odds = league.fielded().table()
    assert odds.sum() == pytest.approx(1.0)
    assert dict(zip(ids.tolist(), odds.tolist(), strict=True))[snapshot] > 0


def test_adopted_versions_join_once_a_snapshot_interval_and_pulled_ones_always() -> None:
    self_play = SelfPlay(SelfPlayConfig(snapshot_interval=100), seed=0)
    weights = named_arrays(network())
    # A group in rounds adopts a version every few updates.
    for version, updates in enumerate(range(0, 260, 10), start=1):
        self_play.add_version(version, weights, adopted_at=updates)
    assert self_play.league.versions() == [1, 11, 21]  # at 0, 100 and 200 updates
    self_play.add_version(100, weights)
    self_play.add_version(101, weights)
    assert self_play.league.versions() == [1, 11, 21, 100, 101]


def test_the_pool_keeps_at_most_pool_size_weights_and_every_rating() -> None:
    league = League(SelfPlayConfig(pool_size=3, opponent_slots=2), seed=0)
    ids = [league.add_snapshot(named_arrays(network(i)), updates=i) for i in range(10)]
    assert len(league.state_dict()["weights"]) == 3
    assert {e.name for e in league.ratings()} >= {f"snapshot {i}" for i in range(10)}
    assert set(league.fielded().ids) <= set(ids[-3:])
    assert len(league.fielded().ids) == 2


def test_league_state_round_trips_and_bad_state_changes_nothing() -> None:
    league = League(SelfPlayConfig(), seed=0)
    league.add_snapshot(named_arrays(network()), updates=5)
    version = league.add_version(7, named_arrays(network(3)))
    assert league.add_version(7, named_arrays(network(3))) is None
    league.record(np.array([RANDOM, LOOKAHEAD]), np.array([1.0, 0.0]))
    state = league.state_dict()
    restored = League(SelfPlayConfig(), seed=1)
    restored.load_state_dict(state)
    assert restored.ratings() == league.ratings()
    assert restored.versions() == [7]
    assert version is not None
    before = restored.ratings()
    with pytest.raises(ValueError):
        restored.load_state_dict({"format": 1, "entries": [{"nonsense": 1}]})
    assert restored.ratings() == before


def test_an_actors_memory_is_bounded_whatever_the_pools_size() -> None:
    """Two hundred snapshots in the league; the board's size and the actor's networks stay
    within the slots (and the games under way), board after board."""
    slots, envs = 4, 6
    league = League(SelfPlayConfig(pool_size=200, opponent_slots=slots, latest_share=0.0), seed=0)
    weights = named_arrays(network())
    board = WeightsBoard(board_layout(weights, slots))
    spec = OpponentsSpec(board_name=board.name, board_layout=board.layout, epsilon=0.1)
    env = TwoPlayerVectorEnv("pettingzoo/tictactoe_v3", envs)
    pool = OpponentPool(spec, RULES, latest=network(), make_net=network, playing=env.playing)
    env.opponents = pool
    try:
        obs, _ = env.reset(seed=0)
        rng = np.random.default_rng(0)
        board_bytes = board.layout.num_floats
        for i in range(200):
            league.add_snapshot(named_arrays(network(i)), updates=i)
            publish(board, league.fielded())
            assert board.layout.num_floats == board_bytes
            for _ in range(3):
                legal = obs[:, 18:] > 0.5
                legal[~legal.any(axis=1), 0] = True
                obs, *_ = env.step(np.argmax(rng.random(legal.shape) + legal, axis=1))
            assert pool.networks <= slots + envs
        view = read(board)
        assert len(view.networks) == slots
    finally:
        pool.close()
        board.close()
        env.close()
