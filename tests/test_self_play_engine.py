"""Self-play in the engine: the league fills, games are rated, ratings survive a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedrl.client.commands.state_dir import Autosaver, ModelIdentity, StateDir
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.self_play_config import SelfPlayConfig

pytest.importorskip("pettingzoo")

GAME = "pettingzoo/tictactoe_v3"


def engine_config(workers: int) -> EngineConfig:
    return EngineConfig(
        env=GAME,
        workers=workers,
        envs_per_worker=4,
        eval_interval=300,
        eval_episodes=3,
        self_play=SelfPlayConfig(snapshot_interval=40, opponent_slots=2, pool_size=3),
    )


LEARNER = LearnerConfig(hidden=(32,), learning_starts=64, batch_size=16, device="cpu")


@pytest.mark.parametrize("workers", [0, 1])
def test_dqn_self_play_rates_its_games_snapshots_and_evaluates_both_seats(workers: int) -> None:
    with TrainingEngine(engine_config(workers), LEARNER) as engine:
        evaluated = None
        while engine.counters.env_steps < 400 or evaluated is None:
            result = engine.poll()
            evaluated = result.evaluation or evaluated
            assert result.rating is not None
        assert engine.self_play is not None
        ratings = {r.name: r for r in engine.self_play.ratings()}
    assert ratings["random"].rating == 0.0
    assert sum(r.games for r in ratings.values()) == engine.counters.episodes
    assert any(name.startswith("snapshot ") for name in ratings)
    assert {(m.opponent, m.seat) for m in evaluated.matches} == {
        ("random", 0),
        ("random", 1),
        ("lookahead", 0),
        ("lookahead", 1),
    }
    assert all(m.games == 3 for m in evaluated.matches)
    assert len(evaluated.returns) == 12


def test_ppo_self_play_plays_rated_games() -> None:
    config = PPOConfig(rollout_steps=8, epochs=1, minibatch_size=16, device="cpu")
    with TrainingEngine(engine_config(0), config) as engine:
        while engine.counters.episodes < 20:
            engine.poll()
        assert engine.self_play is not None
        games = sum(r.games for r in engine.self_play.ratings())
    assert games == engine.counters.episodes


def test_learner_ranks_are_refused_for_a_game() -> None:
    with pytest.raises(ValueError, match="one learner rank"):
        TrainingEngine(engine_config(0), LEARNER, ranks=object())  # type: ignore[arg-type]


def test_ratings_and_the_pool_survive_a_restart_of_the_client(tmp_path: Path) -> None:
    identity = ModelIdentity(env=GAME, architecture="dqn/dueling-mlp-32")

    def run(steps: int) -> tuple[list[object], int]:
        state = StateDir(tmp_path, "Макар", identity)
        engine = TrainingEngine(engine_config(0), LEARNER)
        try:
            autosave = Autosaver(state, engine, model_every=1000, progress_every=1000)
            autosave.resume()
            with engine:
                while engine.counters.env_steps < steps:
                    autosave(engine.poll())
                autosave.save_all()
                assert engine.self_play is not None
                return list(engine.self_play.ratings()), engine.counters.env_steps
        finally:
            engine.close()
            state.close()

    first, steps = run(300)
    resumed_engine = TrainingEngine(engine_config(0), LEARNER)
    state = StateDir(tmp_path, "Макар", identity)
    try:
        Autosaver(state, resumed_engine, model_every=1000, progress_every=1000).resume()
        assert resumed_engine.self_play is not None
        assert resumed_engine.self_play.ratings() == first
    finally:
        resumed_engine.close()
        state.close()
    second, _ = run(steps + 200)
    # Training went on from the saved league: every earlier player is still rated.
    assert {r.name for r in first} <= {r.name for r in second}  # type: ignore[attr-defined]
