"""A whole learner copied into another: networks, Adam, clocks and replay; bad states refused."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.frame_replay import FrameReplay
from fedrl.client.training.learner import Learner, dqn_loss
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.learner_copy import export_learner, import_learner
from fedrl.client.training.ppo_learner import PPOConfig
from fedrl.client.training.replay import PrioritizedReplay
from fedrl.client.training.transitions import LearnerTransitions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIG = LearnerConfig(
    hidden=(16,),
    batch_size=16,
    learning_starts=32,
    target_update_interval=7,
    beta_anneal_updates=100,
    replay_capacity=300,
    device="cpu",
)
Named = list[tuple[str, np.ndarray]]


def transitions(count: int, seed: int, obs_shape: tuple[int, ...] = (4,)) -> LearnerTransitions:
    rng = np.random.default_rng(seed)
    return LearnerTransitions(
        obs=rng.normal(size=(count, *obs_shape)).astype(np.float32),
        action=rng.integers(0, 2, count),
        reward=rng.normal(size=count).astype(np.float32),
        next_obs=rng.normal(size=(count, *obs_shape)).astype(np.float32),
        discount=np.full(count, 0.9, np.float32),
    )


def trained_donor() -> Learner:
    donor = Learner(obs_shape=(4,), n_actions=2, config=CONFIG)
    donor.add(transitions(200, seed=1))
    donor.train(40)
    return donor


def fresh_copier() -> Learner:
    copier = Learner(obs_shape=(4,), n_actions=2, config=dataclasses.replace(CONFIG, seed=9))
    copier.add(transitions(50, seed=2))
    return copier


def same_tensors(a: Any, b: Any) -> bool:
    """Nested state dicts equal tensor by tensor."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_tensors(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_a_dqn_copy_holds_the_donors_networks_adam_clock_and_newest_transitions() -> None:
    donor, copier = trained_donor(), fresh_copier()
    state = export_learner(donor, replay_transitions=120)

    added = import_learner(copier, donor.weights(), state)

    ours, theirs = copier.state_dict(), donor.state_dict()
    assert same_tensors(ours["online"], theirs["online"])
    assert same_tensors(ours["target"], theirs["target"])
    assert same_tensors(ours["optimizer"]["state"], theirs["optimizer"]["state"])
    assert copier.updates == donor.updates == 40 and copier.beta() == donor.beta()
    # The donor's newest 120 transitions are now the copier's newest, after its own 50.
    assert added == 120 and len(copier.replay) == 170
    newest, expected = copier.replay.recent(120), donor.replay.recent(120)
    for column in ("obs", "action", "reward", "next_obs", "discount"):
        np.testing.assert_array_equal(getattr(newest, column), getattr(expected, column))


def test_the_replay_sample_stays_within_its_byte_budget() -> None:
    donor = trained_donor()
    # A transition here: two 4-float observations, an int64 action, float32 reward and discount.
    per_transition = 2 * 4 * 4 + 8 + 4 + 4

    state = dict(
        export_learner(donor, replay_transitions=150, max_replay_bytes=per_transition * 30)
    )

    assert len(state["replay/action"]) == 30


def test_the_copy_takes_the_very_step_the_donor_would_take_next() -> None:
    donor, copier = trained_donor(), fresh_copier()
    import_learner(copier, donor.weights(), export_learner(donor, replay_transitions=0))
    batch = transitions(16, seed=3)

    def step(learner: Learner) -> list[torch.Tensor]:
        obs, next_obs = torch.from_numpy(batch.obs), torch.from_numpy(batch.next_obs)
        loss, _ = dqn_loss(
            learner.online(obs),
            learner.online(next_obs).detach(),
            learner.target(next_obs).detach(),
            torch.from_numpy(batch.action),
            torch.from_numpy(batch.reward),
            torch.from_numpy(batch.discount),
            torch.ones(16),
            double=True,
            huber_delta=1.0,
        )
        learner.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        learner.optimizer.step()
        return [p.detach().clone() for p in learner.online.parameters()]

    # Adam's moments and step count decide the step: copied, the step is the donor's.
    assert all(torch.equal(a, b) for a, b in zip(step(donor), step(copier), strict=True))


def test_a_ppo_copy_holds_adam_and_the_clock_of_its_learning_rate_schedule() -> None:
    ppo = PPOConfig(rollout_steps=16, epochs=2, minibatch_size=32, anneal_steps=5_000, device="cpu")
    engine = EngineConfig(workers=0, envs_per_worker=4, eval_interval=0)
    with TrainingEngine(engine, ppo) as donor:
        donor.run(lambda c: c.env_steps >= 640)
        model, state = (
            donor.weights(),
            donor.learner_state(replay_transitions=1_000, max_replay_bytes=1 << 20),
        )
        expected = donor.learner.state_dict()
        rate = donor.learner.learning_rate()
    with TrainingEngine(dataclasses.replace(engine, seed=5), ppo) as copier:
        copier.run(lambda c: c.env_steps >= 64)

        added = copier.copy_learner(model, state)

        ours = copier.learner.state_dict()
        assert added == 0 and not any(name.startswith("replay/") for name, _ in state)
        assert same_tensors(ours["net"], expected["net"])
        assert same_tensors(ours["optimizer"]["state"], expected["optimizer"]["state"])
        assert (ours["updates"], ours["rounds"], ours["env_steps"]) == (
            expected["updates"],
            expected["rounds"],
            expected["env_steps"],
        )
        assert copier.learner.learning_rate() == rate


def test_after_a_copy_the_engine_trains_at_its_replay_ratio_from_there() -> None:
    config = EngineConfig(workers=0, envs_per_worker=4, steps_per_slot=4, eval_interval=0)
    learner = dataclasses.replace(CONFIG, replay_capacity=2_000)
    with TrainingEngine(config, learner) as donor:
        donor.run(lambda c: c.env_steps >= 2_000)
        model, state = (
            donor.weights(),
            donor.learner_state(replay_transitions=500, max_replay_bytes=1 << 20),
        )
    with TrainingEngine(dataclasses.replace(config, seed=3), learner) as copier:
        copier.run(lambda c: c.env_steps >= 200)
        copier.copy_learner(model, state)
        steps, updates = copier.counters.env_steps, copier.counters.updates

        copier.run(lambda c: c.env_steps >= steps + 400)

        # The donor's ~800 updates are no debt: the copier keeps taking 0.5 per env step.
        trained = copier.counters.updates - updates
        assert updates >= 800 and 0.5 * 400 - 16 <= trained <= 0.5 * (400 + 16)


# -- refused states ------------------------------------------------------------


def _entry(state: Named, name: str, array: np.ndarray) -> Named:
    return [(n, array if n == name else a) for n, a in state]


MUTATIONS: dict[str, Callable[[Named], Named]] = {
    "target of another shape": lambda s: _entry(
        s, "target/torso.0.weight", np.zeros((3, 4), np.float32)
    ),
    "unknown part": lambda s: [*s, ("critic/w", np.zeros(2, np.float32))],
    "no position": lambda s: [(n, a) for n, a in s if not n.startswith("position/")],
    "negative updates": lambda s: _entry(s, "position/updates", np.asarray(-3, np.int64)),
    "a count as a fraction": lambda s: _entry(s, "position/updates", np.asarray(2.5, np.float32)),
    "a parameter past the last": lambda s: [*s, ("optimizer/99/exp_avg", np.zeros(2, np.float32))],
    "moments of another shape": lambda s: _entry(
        s, "optimizer/0/exp_avg", np.zeros((2, 2), np.float32)
    ),
    "half of Adam's state": lambda s: [(n, a) for n, a in s if n != "optimizer/1/exp_avg_sq"],
    "a replay column missing": lambda s: [(n, a) for n, a in s if n != "replay/discount"],
    "an action past the last": lambda s: _entry(s, "replay/action", np.full(60, 7, np.int64)),
    "a transition of another shape": lambda s: _entry(
        s, "replay/obs", np.zeros((60, 5), np.float32)
    ),
    "a non-finite moment": lambda s: _entry(
        s, "optimizer/1/exp_avg", np.full(16, np.nan, np.float32)
    ),
    "a target of whole numbers": lambda s: _entry(s, "target/torso.0.bias", np.zeros(16, np.int64)),
}


@pytest.mark.parametrize("mutation", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_a_state_that_does_not_fit_is_refused_and_changes_nothing(
    mutation: Callable[[Named], Named],
) -> None:
    donor, copier = trained_donor(), fresh_copier()
    state = mutation(export_learner(donor, replay_transitions=60))
    before, held = copier.state_dict(), len(copier.replay)

    with pytest.raises(ValueError):
        import_learner(copier, donor.weights(), state)

    assert same_tensors(copier.state_dict(), before) and len(copier.replay) == held


def test_a_model_of_another_shape_is_refused_and_changes_nothing() -> None:
    donor, copier = trained_donor(), fresh_copier()
    model = [(n, np.zeros((1, *a.shape), np.float32)) for n, a in donor.weights()]
    before = copier.state_dict()

    with pytest.raises(ValueError, match="model"):
        import_learner(copier, model, export_learner(donor, replay_transitions=0))

    assert same_tensors(copier.state_dict(), before)


_DONOR = trained_donor()
_STATE = export_learner(_DONOR, replay_transitions=20)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    index=st.integers(0, len(_STATE) - 1),
    change=st.sampled_from(["drop", "rename", "reshape", "retype", "duplicate"]),
    name=st.text(min_size=1, max_size=12),
)
def test_any_damaged_state_is_taken_whole_or_refused_with_nothing_changed(
    index: int, change: str, name: str
) -> None:
    # prepare: one entry of a valid state damaged
    state = list(_STATE)
    entry, array = state[index]
    if change == "drop":
        del state[index]
    elif change == "rename":
        state[index] = (name, array)
    elif change == "reshape":
        state[index] = (entry, array.reshape(-1)[:-1] if array.size else np.zeros(1, array.dtype))
    elif change == "retype":
        state[index] = (entry, array.astype(np.int64 if array.dtype.kind == "f" else np.float32))
    else:
        state.append((entry, array))
    copier = fresh_copier()
    before, held = copier.state_dict(), len(copier.replay)

    # act
    try:
        import_learner(copier, _DONOR.weights(), state)
    except ValueError:
        # assert: a refusal leaves the learner as it was
        assert same_tensors(copier.state_dict(), before) and len(copier.replay) == held
    else:
        assert copier.updates == _DONOR.updates


# -- the replay's newest transitions ---------------------------------------------


def test_a_full_replay_gives_its_newest_transitions_oldest_first() -> None:
    replay = PrioritizedReplay(10, (4,), seed=0)
    batch = transitions(25, seed=4)
    replay.add(batch)

    recent = replay.recent(4)

    np.testing.assert_array_equal(recent.obs, batch.obs[21:])
    np.testing.assert_array_equal(recent.action, batch.action[21:])
    assert len(replay.recent(100)) == 10 and len(replay.recent(0)) == 0


def test_a_frame_replay_gives_its_newest_transitions_with_their_stacks() -> None:
    replay = FrameReplay(64, (2, 3, 3), seed=0)
    frames = np.arange(12 * 9, dtype=np.uint8).reshape(12, 3, 3)
    obs = np.stack([frames[i : i + 2] for i in range(10)])
    batch = LearnerTransitions(
        obs=obs[:-1],
        action=np.zeros(9, np.int64),
        reward=np.arange(9, dtype=np.float32),
        next_obs=obs[1:],
        discount=np.full(9, 0.9, np.float32),
    )
    replay.add(batch)

    recent = replay.recent(3)

    np.testing.assert_array_equal(recent.obs, batch.obs[6:])
    np.testing.assert_array_equal(recent.next_obs, batch.next_obs[6:])
    np.testing.assert_array_equal(recent.reward, batch.reward[6:])
