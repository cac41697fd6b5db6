"""Every actor, env and restart sees its own random sequence; a seed reproduces a run."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from fedrl.client.training.actor import ActorCore, make_actor_spec
from fedrl.client.training.vector_env import reset_seeded

ROOT = np.random.SeedSequence(1234)


def core(index: int, *, generation: int = 0, env_id: str = "CartPole-v1") -> ActorCore:
    spec = make_actor_spec(
        index,
        num_actors=2,
        generation=generation,
        seed_root=ROOT,
        env_id=env_id,
        num_envs=4,
        exploration_base=0.4,
        exploration_alpha=7.0,
        n_step=3,
        gamma=0.99,
        hidden=(16,),
        dueling=True,
        steps_per_slot=4,
    )
    return ActorCore(spec)


def trace(actor: ActorCore) -> tuple[np.ndarray, np.ndarray]:
    got = actor.collect(20)
    actor.close()
    return got.batch.obs, got.batch.action


def test_two_actors_see_different_observations_and_actions() -> None:
    # prepare / act
    obs0, act0 = trace(core(0))
    obs1, act1 = trace(core(1))

    # assert
    n = min(len(obs0), len(obs1))
    assert not np.allclose(obs0[:n], obs1[:n])
    assert not np.array_equal(act0[:n], act1[:n])


def test_the_same_actor_spec_reproduces_its_sequence() -> None:
    obs_a, act_a = trace(core(0))
    obs_b, act_b = trace(core(0))

    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(act_a, act_b)


def test_a_restarted_actor_continues_on_a_fresh_stream() -> None:
    obs_first, _ = trace(core(1, generation=0))
    obs_restart, _ = trace(core(1, generation=1))

    n = min(len(obs_first), len(obs_restart))
    assert not np.allclose(obs_first[:n], obs_restart[:n])


def test_envs_of_one_actor_start_from_distinct_states() -> None:
    # prepare: a Sync vector env (one seed per env) and the native CartPole one
    sync = gym.make_vec("CartPole-v1", num_envs=6, vectorization_mode="sync")
    native = gym.make_vec("CartPole-v1", num_envs=6, vectorization_mode="vector_entry_point")

    # act
    starts = [reset_seeded(env, np.random.SeedSequence(5)) for env in (sync, native)]

    # assert
    for obs in starts:
        assert len({tuple(row) for row in obs.round(6)}) == 6
    sync.close()
    native.close()
