"""The frame replay keeps each frame once and gives back exactly the stacks a naive store would."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.frame_replay import FrameReplay
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.nstep import NStepAccumulator
from fedrl.client.training.transitions import LearnerTransitions
from tests.support.frame_env import (
    ENV_ID,
    GAMMA,
    OBS_SHAPE,
    STACK,
    ScriptedFrameEnv,
    collect,
    frame_actor,
    keys,
    register,
)


def naive_transitions(
    env: ScriptedFrameEnv, *, n_step: int, clip: bool, episodic_life: bool
) -> LearnerTransitions:
    """What a store of whole stacks holds after the logged steps: NStepAccumulator over the
    stacks themselves, with the games' rules (clipped rewards, a lost life cuts the return).
    Rows of the last step wait for their bootstrap frame in the frame actor, so not here."""
    log = env.log
    nstep = NStepAccumulator(
        num_envs=env.num_envs, obs_shape=OBS_SHAPE, n_step=n_step, gamma=GAMMA, obs_dtype=np.uint8
    )
    ended = np.zeros(env.num_envs, dtype=np.bool_)
    lives = np.full(env.num_envs, -1)
    none = np.zeros((0, *OBS_SHAPE), dtype=np.uint8)
    empty = np.zeros(0, dtype=np.float32)
    rows = [LearnerTransitions(none, np.zeros(0, dtype=np.int64), empty, none, empty)]
    for index, step in enumerate(log[:-1]):
        valid = ~ended
        lost = valid & (step.lives < lives) & ~(step.terminated | step.truncated)
        cut = lost if episodic_life else np.zeros_like(lost)
        batch, _ = nstep.push(
            obs=step.obs,
            action=step.action,
            reward=np.sign(step.reward) if clip else step.reward,
            next_obs=log[index + 1].obs,
            terminated=step.terminated | cut,
            truncated=step.truncated,
            continues=cut,
        )
        rows.append(batch)
        ended = (step.terminated | step.truncated) & valid
        lives = step.lives
    return LearnerTransitions.concat(rows)


games = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**16),
        "envs": st.integers(1, 3),
        "n_step": st.integers(1, 4),
        "steps": st.integers(1, 6),
        "segments": st.integers(1, 10),
        "clip": st.booleans(),
        "episodic_life": st.booleans(),
    }
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(games)
def test_frame_replay_rebuilds_the_stacks_a_naive_store_holds_across_episode_ends(
    game: dict[str, int],
) -> None:
    actor = frame_actor(
        envs=game["envs"],
        n_step=game["n_step"],
        steps=game["steps"],
        seed=game["seed"],
        clip=bool(game["clip"]),
        episodic_life=bool(game["episodic_life"]),
    )
    replay = FrameReplay(10_000, OBS_SHAPE, seed=0)

    rebuilt = collect(actor, replay, game["segments"], game["steps"])

    naive = naive_transitions(
        actor.env,
        n_step=game["n_step"],
        clip=bool(game["clip"]),
        episodic_life=bool(game["episodic_life"]),
    )
    assert keys(rebuilt) == keys(naive)
    assert len(replay) == len(naive)


@settings(max_examples=25, deadline=None)
@given(games, st.randoms(use_true_random=False))
def test_whole_transitions_come_back_exactly_in_any_row_order(
    game: dict[str, int], shuffle: object
) -> None:
    actor = frame_actor(
        envs=game["envs"],
        n_step=game["n_step"],
        steps=game["steps"],
        seed=game["seed"],
        clip=False,
        episodic_life=True,
    )
    collect(actor, FrameReplay(10_000, OBS_SHAPE, seed=0), game["segments"], game["steps"])
    naive = naive_transitions(actor.env, n_step=game["n_step"], clip=False, episodic_life=True)
    if not len(naive):
        return
    by_env = np.argsort(np.arange(len(naive)) % game["envs"], kind="stable")
    for order in (by_env, np.random.default_rng(game["seed"]).permutation(len(naive))):
        rows = naive.rows(order)
        replay = FrameReplay(20_000, OBS_SHAPE, seed=0)

        back = replay.transitions(replay.add_transitions(rows))

        for name in ("obs", "action", "reward", "next_obs", "discount"):
            np.testing.assert_array_equal(getattr(back, name), getattr(rows, name))


def test_frames_of_consecutive_stacks_are_stored_once() -> None:
    actor = frame_actor(envs=2, n_step=3, steps=8, seed=1, clip=True, episodic_life=True)
    replay = FrameReplay(10_000, OBS_SHAPE, seed=0)

    rebuilt = collect(actor, replay, 10, 8)

    # One frame per env and step in the ring; the naive store holds 2·k per transition.
    assert replay.frames_written == 10 * 8 * 2
    assert len(rebuilt) >= 10 * 8 * 2 * 0.7


@settings(max_examples=15, deadline=None)
@given(games)
def test_a_full_ring_only_ever_samples_transitions_that_were_collected(
    game: dict[str, int],
) -> None:
    actor = frame_actor(
        envs=game["envs"],
        n_step=game["n_step"],
        steps=game["steps"],
        seed=game["seed"],
        clip=True,
        episodic_life=bool(game["episodic_life"]),
    )
    # A ring barely longer than a segment: transitions keep dying as frames are overwritten.
    capacity = (game["steps"] + STACK + game["n_step"]) * game["envs"]
    replay = FrameReplay(capacity, OBS_SHAPE, prioritized=False, seed=0)
    seen: Counter[tuple[bytes, int, float, bytes, float]] = Counter()
    for _ in range(game["segments"] * 3):
        replay.add_frames(np.arange(game["envs"]), actor.collect(game["steps"]).segment)
        if len(replay):
            seen.update(keys(replay.sample(16, beta=0.4).batch))

    naive = keys(
        naive_transitions(
            actor.env,
            n_step=game["n_step"],
            clip=True,
            episodic_life=bool(game["episodic_life"]),
        )
    )
    assert set(seen) <= set(naive)


def test_a_lost_life_cuts_the_return_and_the_game_goes_on() -> None:
    actor = frame_actor(envs=1, n_step=3, steps=200, seed=3, clip=False, episodic_life=True)
    got = actor.collect(200)
    log = actor.env.log

    lost = [
        i
        for i in range(1, len(log))
        if log[i].lives[0] < log[i - 1].lives[0]
        and not (log[i].terminated[0] or log[i].truncated[0])
        and not (log[i - 1].terminated[0] or log[i - 1].truncated[0])
    ]
    assert lost, "the scripted game should lose a life within 200 steps"
    segment = got.segment
    for step in lost:
        cut = (segment.obs_step == step) & (segment.next_step == step + 1)
        assert segment.discount[cut].tolist() == [0.0]
        # The step after the loss is an ordinary transition of the same game.
        if step + 1 + 3 < 199:
            assert (segment.obs_step == step + 1).any()
        assert not segment.first[step + 1, 0]
    # Scores are raw and a game spans its lives.
    assert got.episode_returns.size >= 1
    games_end = [i for i, s in enumerate(log) if s.terminated[0] or s.truncated[0]]
    first_end = games_end[0]
    assert got.episode_returns[0] == pytest.approx(sum(s.reward[0] for s in log[: first_end + 1]))


def test_an_image_env_that_is_not_atari_trains_on_whole_observations_stored_frame_by_frame() -> (
    None
):
    register()
    engine = TrainingEngine(
        EngineConfig(env=ENV_ID, workers=0, envs_per_worker=2, eval_interval=0),
        LearnerConfig(learning_starts=32, batch_size=8, replay_capacity=4_000, device="cpu"),
    )

    with engine:
        while engine.learner.updates < 8:
            engine.poll()

    replay = engine.learner.replay
    assert not engine.frames and isinstance(replay, FrameReplay)
    # Whole stacks in, each frame a neighbouring row shares stored once.
    assert replay.frames_written < 3 * len(replay)
