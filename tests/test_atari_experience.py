"""Experience of frame stacks: pushed in chains, compressed far below raw, round-tripped exactly."""

from __future__ import annotations

import numpy as np
import pytest

from fedrl.client.federation.experience_sync import UnsentTransitions
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.training.experience_conversion import to_experience, to_transitions
from fedrl.client.training.frame_replay import FrameReplay, chain_order, make_replay
from fedrl.client.training.q_network import architecture_name, build_q_network, named_arrays
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.common.experience import batch_header, decode_batch, encode_batch
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.experience.validation import ValidationLimits, validate_batch
from tests.support.frame_env import OBS_SHAPE, collect, frame_actor, keys


def game_transitions(segments: int = 12) -> LearnerTransitions:
    """Transitions as the engine hands them to experience exchange: per segment, by env."""
    actor = frame_actor(envs=3, n_step=3, steps=8, seed=7, clip=True, episodic_life=True)
    return collect(actor, FrameReplay(10_000, OBS_SHAPE, seed=0), segments, 8)


def test_chain_order_puts_each_stack_after_the_one_it_continues() -> None:
    transitions = game_transitions()
    rows = len(transitions)
    batch = transitions.rows(np.random.default_rng(0).permutation(rows))

    order = chain_order(batch.obs)

    assert sorted(order.tolist()) == list(range(rows))
    obs = batch.obs[order]
    continues = [np.array_equal(obs[i, :-1], obs[i - 1, 1:]) for i in range(1, len(obs))]
    shuffled = [np.array_equal(batch.obs[i, :-1], batch.obs[i - 1, 1:]) for i in range(1, rows)]
    assert sum(continues) > 0.8 * len(continues) > sum(shuffled)


def test_pushed_frame_stacks_round_trip_exactly_at_a_small_fraction_of_their_size() -> None:
    local = game_transitions()
    unsent = UnsentTransitions(1024, OBS_SHAPE)
    unsent.add(local)
    taken = unsent.take()
    assert taken is not None
    batch = to_experience(taken, n_step=3, gamma=0.9, spec_hash="h")

    encoded = encode_batch(batch)
    header = batch_header(batch, encoded, session="s", participant_id="p", sequence=1)
    back = to_transitions(decode_batch(header, encoded.block, encoded.data))

    assert keys(back) == keys(local)
    assert back.obs.dtype == np.uint8
    # Consecutive stacks share three frames of four; random frames do not compress, so
    # about one frame per transition is what must travel: under a third of the raw bytes.
    assert len(encoded.data) < encoded.block.raw_size / 3


def test_pulled_frame_stacks_are_stored_once_per_frame_and_sampled_back_exactly() -> None:
    pulled = to_experience(game_transitions(), n_step=3, gamma=0.9, spec_hash="h")
    # The learner's one replay, as the engine makes it for a game; pulled rows go in beside
    # the actors' frames (TrainingEngine.add_foreign).
    replay = make_replay(2_000, OBS_SHAPE, prioritized=True, alpha=0.6, eps=1e-6, seed=0)

    replay.add(to_transitions(pulled), foreign=True)

    assert isinstance(replay, FrameReplay)
    assert replay.frames_written < 1.5 * len(pulled)
    drawn = replay.sample(64, beta=0.4).batch
    assert set(keys(drawn)) <= set(keys(to_transitions(pulled)))


def test_the_spec_of_a_game_says_uint8_frames_without_28k_bounds() -> None:
    weights = named_arrays(build_q_network((4, 84, 84), 4))

    spec = model_spec(
        "ALE/Breakout-v5", weights, architecture_name((), True, obs_shape=(4, 84, 84))
    )

    space = spec.observation_space
    assert space.dtype == tpb.DTYPE_UINT8 and list(space.shape) == [4, 84, 84]
    assert not space.low and not space.high
    assert spec.algorithm == "dqn/dueling-cnn-nature"


def test_the_server_accepts_a_game_batch_for_its_spec_and_refuses_floats() -> None:
    weights = named_arrays(build_q_network((4, 84, 84), 4))
    spec = model_spec("ALE/Breakout-v5", weights, "dqn/dueling-cnn-nature")
    frames = np.random.default_rng(0).integers(0, 256, (20, 84, 84), dtype=np.uint8)
    stacks = np.stack([frames[i : i + 4] for i in range(17)])
    rows = LearnerTransitions(
        obs=stacks[:-1],
        action=np.zeros(16, dtype=np.int64),
        reward=np.ones(16, dtype=np.float32),
        next_obs=stacks[1:],
        discount=np.full(16, 0.9, dtype=np.float32),
    )
    batch = to_experience(rows, n_step=1, gamma=0.9, spec_hash="h")

    validate_batch(batch, spec=spec, spec_hash="h", limits=ValidationLimits())
    floats = to_experience(
        LearnerTransitions(
            obs=rows.obs.astype(np.float32),
            action=rows.action,
            reward=rows.reward,
            next_obs=rows.next_obs.astype(np.float32),
            discount=rows.discount,
        ),
        n_step=1,
        gamma=0.9,
        spec_hash="h",
    )
    with pytest.raises(ValueError, match="uint8"):
        validate_batch(floats, spec=spec, spec_hash="h", limits=ValidationLimits())
