"""The Learner end to end: it learns, moves its target, keeps and restores its state."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedrl.client.training.device import resolve_device
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.replay import PrioritizedReplay
from fedrl.client.training.transitions import LearnerTransitions

# Tiny networks: one intra-op thread each (conftest's one_torch_thread).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

# A deterministic chain: states 0..3 (one-hot). "right" (action 0) moves to the
# next state; from state 3 it ends the episode with reward 1. "quit" (action 1)
# ends it at once with reward 0.1. So Q(s, right) = gamma**(3 - s) and
# Q(s, quit) = 0.1, and the optimal policy always goes right.
CHAIN = 4
GAMMA = 0.9
TRUE_Q = np.array([[GAMMA ** (CHAIN - 1 - s), 0.1] for s in range(CHAIN)], dtype=np.float32)

SMALL = LearnerConfig(
    lr=3e-3,
    gamma=GAMMA,
    batch_size=32,
    hidden=(32,),
    target_update_interval=25,
    replay_capacity=1024,
    learning_starts=64,
    beta_anneal_updates=200,
    device="cpu",
    seed=0,
)


def _chain_transitions(copies: int) -> LearnerTransitions:
    eye = np.eye(CHAIN, dtype=np.float32)
    rows = []
    for s in range(CHAIN):
        last = s == CHAIN - 1
        # (obs, action, reward, next_obs, discount); terminal rows bootstrap with 0.
        rows.append(
            (eye[s], 0, 1.0 if last else 0.0, eye[min(s + 1, CHAIN - 1)], 0.0 if last else GAMMA)
        )
        rows.append((eye[s], 1, 0.1, eye[s], 0.0))
    obs, action, reward, next_obs, discount = zip(*(rows * copies), strict=True)
    return LearnerTransitions(
        obs=np.stack(obs),
        action=np.array(action, dtype=np.int64),
        reward=np.array(reward, dtype=np.float32),
        next_obs=np.stack(next_obs),
        discount=np.array(discount, dtype=np.float32),
    )


def _learned_q(learner: Learner) -> np.ndarray:
    with torch.no_grad():
        q: np.ndarray = learner.online(torch.eye(CHAIN, device=learner.device)).cpu().numpy()
    return q


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"double_dqn": False, "dueling": False, "prioritized": False},
        {"target_update": "polyak", "target_update_interval": 1, "polyak_tau": 0.05},
        {"device_update": "on"},
        {"device_update": "on", "double_dqn": False, "dueling": False, "prioritized": False},
    ],
    ids=["defaults", "plain-dqn-uniform", "polyak", "device-update", "device-update-uniform"],
)
def test_learner_learns_the_true_q_values_of_a_chain(changes: dict[str, Any]) -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=dataclasses.replace(SMALL, **changes))
    learner.add(_chain_transitions(copies=16))

    # ~0.02 from the truth after 400 updates for seeds 0-2 of every variant.
    stats = learner.train(400)

    np.testing.assert_allclose(_learned_q(learner), TRUE_Q, atol=0.05)
    assert stats["updates"] == 400.0
    assert np.isfinite(stats["loss"])


def test_training_writes_priorities_back_to_the_replay() -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    learner.add(_chain_transitions(copies=16))
    before = learner.replay.sample(512, beta=1.0).weights

    learner.train(50)

    # Every new transition starts at the same (max) priority: equal weights.
    # After training, priorities follow |TD error| and the weights spread out.
    after = learner.replay.sample(512, beta=1.0).weights
    assert np.ptp(before) == 0.0
    assert np.ptp(after) > 0.1


def test_beta_anneals_from_beta0_to_one() -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    learner.add(_chain_transitions(copies=16))
    assert learner.beta() == pytest.approx(SMALL.beta0)

    learner.train(100)
    halfway = learner.beta()
    learner.train(150)

    assert halfway == pytest.approx(SMALL.beta0 + (1 - SMALL.beta0) * 0.5)
    assert learner.beta() == 1.0


@pytest.mark.parametrize("device_update", ["off", "on"])
def test_hard_target_update_copies_the_online_network_at_the_interval(device_update: str) -> None:
    config = dataclasses.replace(
        SMALL, target_update_interval=10, sample_block=3, device_update=device_update
    )
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=config)
    learner.add(_chain_transitions(copies=16))

    learner.train(9)
    stale = _max_difference(learner.target, learner.online)
    learner.train(1)

    assert stale > 0.0
    assert _max_difference(learner.target, learner.online) == 0.0


def test_a_learner_fed_four_times_its_own_data_updates_its_target_half_as_often() -> None:
    config = dataclasses.replace(SMALL, target_update_interval=10, sample_block=3)
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=config)
    learner.add(_chain_transitions(copies=16))
    learner.set_data_multiple(4.0)

    learner.train(19)
    stale = _max_difference(learner.target, learner.online)
    learner.train(1)
    copied = _max_difference(learner.target, learner.online)
    learner.set_data_multiple(1.0)
    learner.train(9)
    stale_again = _max_difference(learner.target, learner.online)
    learner.train(1)

    assert learner.target_period() == 10
    assert (stale > 0.0, copied, stale_again > 0.0) == (True, 0.0, True)
    assert _max_difference(learner.target, learner.online) == 0.0


@pytest.mark.parametrize(
    ("exponent", "multiple", "period"),
    [(0.5, 1.0, 500), (0.5, 4.0, 1000), (0.5, 2.0, 707), (0.0, 4.0, 500), (1.0, 3.0, 1500)],
)
def test_the_target_period_grows_with_the_data_to_the_configured_power(
    exponent: float, multiple: float, period: int
) -> None:
    config = dataclasses.replace(
        SMALL, target_update_interval=500, target_period_data_exponent=exponent
    )
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=config)

    learner.set_data_multiple(multiple)

    assert learner.target_period() == period


@pytest.mark.parametrize("multiple", [0.5, float("nan"), float("inf")])
def test_a_data_multiple_below_one_or_not_finite_is_refused(multiple: float) -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)

    with pytest.raises(ValueError, match="data multiple must be finite and >= 1"):
        learner.set_data_multiple(multiple)
    assert learner.target_period() == SMALL.target_update_interval


def test_polyak_target_update_moves_the_target_by_tau() -> None:
    tau = 0.25
    config = dataclasses.replace(
        SMALL, target_update="polyak", target_update_interval=1, polyak_tau=tau, sample_block=1
    )
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=config)
    learner.add(_chain_transitions(copies=16))
    target_before = [p.detach().clone() for p in learner.target.parameters()]

    learner.train(1)

    for old, target, online in zip(
        target_before, learner.target.parameters(), learner.online.parameters(), strict=True
    ):
        torch.testing.assert_close(target, old + tau * (online - old))


def test_weights_round_trip_through_set_weights() -> None:
    trained = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    trained.add(_chain_transitions(copies=16))
    trained.train(20)
    fresh = Learner(obs_shape=(CHAIN,), n_actions=2, config=dataclasses.replace(SMALL, seed=1))

    fresh.set_weights(trained.weights())

    for (name, mine), (other_name, theirs) in zip(fresh.weights(), trained.weights(), strict=True):
        assert name == other_name
        np.testing.assert_array_equal(mine, theirs)
    assert _max_difference(fresh.target, fresh.online) == 0.0


def test_set_weights_can_leave_the_target_network_alone() -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    target_before = [p.detach().clone() for p in learner.target.parameters()]
    shifted = [(name, array + 1.0) for name, array in learner.weights()]

    learner.set_weights(shifted, target="keep")

    for old, now in zip(target_before, learner.target.parameters(), strict=True):
        torch.testing.assert_close(now, old)
    assert _max_difference(learner.target, learner.online) == pytest.approx(1.0)


def test_set_weights_can_shift_the_target_network_by_the_same_change() -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    learner.add(_chain_transitions(copies=16))
    learner.train(20)
    online_before = [p.detach().clone() for p in learner.online.parameters()]
    target_before = [p.detach().clone() for p in learner.target.parameters()]
    moved = [(name, array + 0.5) for name, array in learner.weights()]

    learner.set_weights(moved, target="shift")

    for old_target, old_online, target, online in zip(
        target_before,
        online_before,
        learner.target.parameters(),
        learner.online.parameters(),
        strict=True,
    ):
        torch.testing.assert_close(online - target, old_online - old_target)


def test_set_weights_refuses_an_unknown_target_policy() -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)

    with pytest.raises(ValueError, match="target must be one of reset, keep, shift"):
        learner.set_weights(learner.weights(), target="drop")  # type: ignore[arg-type]


def test_state_dict_round_trips_through_torch_save_with_weights_only(tmp_path: Path) -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    learner.add(_chain_transitions(copies=16))
    learner.train(30)
    path = tmp_path / "learner.pt"
    torch.save(learner.state_dict(), path)
    restored = Learner(obs_shape=(CHAIN,), n_actions=2, config=dataclasses.replace(SMALL, seed=9))

    restored.load_state_dict(torch.load(path, weights_only=True))

    assert restored.updates == 30
    assert _max_difference(restored.online, learner.online) == 0.0
    assert _max_difference(restored.target, learner.target) == 0.0
    saved_moments = learner.optimizer.state_dict()["state"]
    restored_moments = restored.optimizer.state_dict()["state"]
    for key, moments in saved_moments.items():
        torch.testing.assert_close(restored_moments[key]["exp_avg_sq"], moments["exp_avg_sq"])
        torch.testing.assert_close(restored_moments[key]["step"], moments["step"])


def test_loading_another_networks_state_is_refused_and_changes_nothing() -> None:
    wide = Learner(obs_shape=(CHAIN,), n_actions=2, config=dataclasses.replace(SMALL, hidden=(64,)))
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    before = learner.weights()

    with pytest.raises(ValueError, match="does not fit"):
        learner.load_state_dict(wide.state_dict())

    for (_, old), (_, now) in zip(before, learner.weights(), strict=True):
        np.testing.assert_array_equal(old, now)


def test_training_before_learning_starts_says_how_far_off_it_is() -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    learner.add(_chain_transitions(copies=1))

    assert not learner.ready()
    with pytest.raises(RuntimeError, match="holds 8 transitions; training starts at 64"):
        learner.train(1)


def test_actions_outside_the_action_space_are_refused() -> None:
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    batch = dataclasses.replace(_chain_transitions(copies=1), action=np.full(8, 2, dtype=np.int64))

    with pytest.raises(ValueError, match="action 2 out of range for 2 actions"):
        learner.add(batch)
    assert len(learner.replay) == 0


def test_building_a_learner_leaves_the_callers_torch_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)

    Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)

    torch.testing.assert_close(torch.rand(3), expected)


def test_same_seed_builds_the_same_network() -> None:
    first = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)
    second = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)

    assert _max_difference(first.online, second.online) == 0.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lr": 0.0}, "lr must be > 0"),
        ({"gamma": 1.5}, r"gamma must lie in \[0, 1\]"),
        ({"target_update": "soft"}, 'must be "hard" or "polyak"'),
        ({"huber_delta": -1.0}, "huber_delta must be > 0 or None"),
        ({"polyak_tau": 0.0}, r"polyak_tau must lie in \(0, 1\]"),
        ({"target_period_data_exponent": -0.5}, r"data_exponent must lie in \[0, 1\]"),
    ],
)
def test_bad_config_values_are_refused_with_the_field_name(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(SMALL, **changes)


def test_resolve_device_turns_auto_into_a_device_that_exists() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"

    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_without_it_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0")


def test_an_unknown_device_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")


def _max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(
        float((x - y).detach().abs().max())
        for x, y in zip(a.parameters(), b.parameters(), strict=True)
    )


@pytest.mark.slow
def test_compiled_learner_learns_the_chain_like_the_eager_one() -> None:
    learner = Learner(
        obs_shape=(CHAIN,), n_actions=2, config=dataclasses.replace(SMALL, compile=True)
    )
    learner.add(_chain_transitions(copies=16))

    learner.train(400)

    np.testing.assert_allclose(_learned_q(learner), TRUE_Q, atol=0.05)


def test_an_injected_empty_replay_is_the_one_trained_from() -> None:
    replay = PrioritizedReplay(256, (CHAIN,), prioritized=False, seed=4)
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL, replay=replay)

    learner.add(_chain_transitions(copies=16))

    assert learner.replay is replay
    assert len(replay) == 128


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
def test_cuda_learner_learns_the_chain(amp: bool) -> None:
    config = dataclasses.replace(SMALL, device="cuda", amp=amp)
    learner = Learner(obs_shape=(CHAIN,), n_actions=2, config=config)
    learner.add(_chain_transitions(copies=16))

    learner.train(400)

    # bf16 keeps ~3 significant digits in the forward pass.
    np.testing.assert_allclose(_learned_q(learner), TRUE_Q, atol=0.08 if amp else 0.05)


@pytest.mark.gpu
@needs_cuda
def test_a_cuda_learners_state_restores_on_a_cpu_learner(tmp_path: Path) -> None:
    on_gpu = Learner(
        obs_shape=(CHAIN,), n_actions=2, config=dataclasses.replace(SMALL, device="cuda")
    )
    on_gpu.add(_chain_transitions(copies=16))
    on_gpu.train(30)
    path = tmp_path / "learner.pt"
    torch.save(on_gpu.state_dict(), path)
    on_cpu = Learner(obs_shape=(CHAIN,), n_actions=2, config=SMALL)

    on_cpu.load_state_dict(torch.load(path, weights_only=True))
    restored = on_cpu.weights()
    on_cpu.add(_chain_transitions(copies=16))
    on_cpu.train(10)  # the optimizer state must work on its new device

    for (_, gpu_array), (_, cpu_array) in zip(on_gpu.weights(), restored, strict=True):
        np.testing.assert_array_equal(cpu_array, gpu_array)
    assert on_cpu.updates == 40
