"""The device update computes what the host update computes.

Its functions (prioritized draws, priority write-back, the update with its
target move) run eagerly on CPU tensors here and are what a CUDA graph
captures on a GPU; the last test, which needs CUDA, checks the captured
graph against them. Some tests reach into the learner (`_step`,
`_captured`) to give both updates the very same draws.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch

from fedrl.client.training.device_replay import DeviceReplay
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.frame_replay import FrameReplay
from fedrl.client.training.learner import Learner
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import named_arrays
from fedrl.client.training.replay import PrioritizedReplay
from fedrl.client.training.transitions import LearnerTransitions
from tests.support.frame_env import OBS_SHAPE, STACK, frame_actor

CPU = torch.device("cpu")
OBS = (4,)


def transitions(rows: int, seed: int) -> LearnerTransitions:
    rng = np.random.default_rng(seed)
    return LearnerTransitions(
        obs=rng.standard_normal((rows, *OBS), dtype=np.float32),
        action=rng.integers(0, 2, size=rows),
        reward=rng.standard_normal(rows, dtype=np.float32),
        next_obs=rng.standard_normal((rows, *OBS), dtype=np.float32),
        discount=np.where(rng.random(rows) < 0.1, 0.0, 0.97).astype(np.float32),
    )


def replay_with_priorities(capacity: int, seed: int) -> PrioritizedReplay:
    """A full replay whose priorities span four orders of magnitude."""
    replay = PrioritizedReplay(capacity, OBS, alpha=0.6, eps=1e-6, seed=seed)
    replay.add(transitions(capacity, seed))
    td = np.random.default_rng(seed + 1).lognormal(0.0, 2.0, size=capacity)
    replay.update_priorities(np.arange(capacity), td)
    return replay


def test_device_draws_follow_the_sum_trees_distribution_and_weights() -> None:
    # prepare: one replay, its sum tree on the host and its priorities mirrored on the device
    capacity, batch, rounds, beta = 48, 64, 1_500, 0.5
    replay = replay_with_priorities(capacity, seed=3)
    mirror = replay.mirror_on(CPU)
    generator = torch.Generator().manual_seed(0)
    expected = mirror.priorities.values.numpy() / mirror.priorities.values.sum().item()

    # act
    host: Counter[int] = Counter()
    device: Counter[int] = Counter()
    for _ in range(rounds):
        host.update(replay.sample(batch, beta).indices.tolist())
        slots, weights = mirror.draw(batch, beta=torch.tensor(beta), generator=generator)
        device.update(slots.tolist())
        # the importance weights are the host's formula on the drawn slots
        probabilities = expected[slots.numpy()]
        host_weights = (capacity * probabilities) ** -beta
        np.testing.assert_allclose(weights.numpy(), host_weights / host_weights.max(), rtol=1e-6)

    # assert: both match P(i) = p_i / sum p within 5 standard errors of a multinomial
    # (stratified draws vary less), and each other
    draws = batch * rounds
    sigma = np.sqrt(expected * (1 - expected) / draws)
    for counts in (host, device):
        frequency = np.array([counts[i] for i in range(capacity)]) / draws
        assert np.all(np.abs(frequency - expected) <= 5 * sigma + 1e-12)
    host_frequency = np.array([host[i] for i in range(capacity)]) / draws
    device_frequency = np.array([device[i] for i in range(capacity)]) / draws
    assert np.all(np.abs(host_frequency - device_frequency) <= 7 * sigma + 1e-12)


def test_device_draws_never_land_on_a_dead_or_empty_slot() -> None:
    # prepare: a replay a third full, and a frame ring where transitions keep dying
    plain = PrioritizedReplay(90, OBS, seed=0)
    plain.add(transitions(30, 0))
    actor = frame_actor(envs=2, n_step=3, steps=6, seed=4, clip=True, episodic_life=True)
    frames = FrameReplay((6 + STACK + 3) * 2, OBS_SHAPE, seed=0)
    frames_mirror = frames.mirror_on(CPU)
    generator = torch.Generator().manual_seed(1)
    half = torch.tensor(0.5)

    # act / assert
    slots, _ = plain.mirror_on(CPU).draw(4_096, beta=half, generator=generator)
    assert int(slots.max()) < 30
    for _ in range(12):
        frames.add_frames(np.arange(2), actor.collect(6).segment)
        if len(frames):
            slots, _ = frames_mirror.draw(512, beta=half, generator=generator)
            live = frames.transitions(slots.numpy())  # rebuilt on the host from live entries
            assert np.all(frames_mirror.priorities.values[slots].numpy() > 0)
            batch = frames_mirror.gather(slots, torch.ones(512))
            np.testing.assert_array_equal(batch.obs.numpy(), live.obs)
            np.testing.assert_array_equal(batch.next_obs.numpy(), live.next_obs)


def test_priorities_written_on_the_device_equal_those_the_host_writes() -> None:
    # prepare: the same replay on both sides; a batch that draws some slots twice
    replay = replay_with_priorities(40, seed=5)
    mirror = replay.mirror_on(CPU)
    slots = np.array([3, 7, 3, 0, 39, 7, 7, 12])
    td = np.array([0.5, 2.0, 0.25, 1e-9, 30.0, 0.1, 4.0, 0.0], dtype=np.float32)

    # act
    replay.update_priorities(slots, td)
    mirror.write_back(torch.from_numpy(slots), torch.from_numpy(td))

    # assert: a fresh copy of the host's priorities is what the device wrote
    written, max_written = mirror.priorities.values.clone(), mirror.priorities.max_priority.item()
    replay.mirror = None
    host = replay.mirror_on(CPU).priorities
    np.testing.assert_allclose(written.numpy(), host.values.numpy(), rtol=1e-12, atol=0)
    assert max_written == pytest.approx(host.max_priority.item(), rel=1e-12)


def test_a_frame_replays_device_copy_rebuilds_the_stacks_the_host_rebuilds() -> None:
    # prepare: segments from a game and the rows of another participant, mirrored from the start
    actor = frame_actor(envs=3, n_step=3, steps=8, seed=2, clip=True, episodic_life=True)
    replay = FrameReplay(400, OBS_SHAPE, seed=0)
    mirror = replay.mirror_on(CPU)
    other = FrameReplay(400, OBS_SHAPE, seed=0)
    other_actor = frame_actor(envs=2, n_step=3, steps=8, seed=9, clip=True, episodic_life=True)
    other.add_frames(np.arange(2), other_actor.collect(8).segment)

    # act: enough to wrap the ring several times
    for _ in range(10):
        replay.add_frames(np.arange(3), actor.collect(8).segment)
        replay.add(other.transitions(np.flatnonzero(other._live)), foreign=True)

    # assert: every live transition reads back the same on the device; dead ones are never drawn
    live = np.flatnonzero(replay._live)
    batch = mirror.gather(torch.from_numpy(live), torch.ones(len(live)))
    host = replay.transitions(live)
    np.testing.assert_array_equal(batch.obs.numpy(), host.obs)
    np.testing.assert_array_equal(batch.next_obs.numpy(), host.next_obs)
    np.testing.assert_array_equal(batch.action.numpy(), host.action)
    np.testing.assert_array_equal(batch.discount.numpy(), host.discount)
    dead = np.setdiff1d(np.arange(400), live)
    assert np.all(mirror.priorities.values[torch.from_numpy(dead)].numpy() == 0)
    assert mirror.size.item() == len(replay)


@pytest.mark.parametrize("obs_shape", [OBS, OBS_SHAPE], ids=["rows", "frames"])
def test_a_device_replay_takes_the_memory_it_is_sized_for(obs_shape: tuple[int, ...]) -> None:
    stack = obs_shape[0] if len(obs_shape) == 3 else None
    kind = FrameReplay if stack else PrioritizedReplay

    mirror = kind(300, obs_shape, seed=0).mirror_on(CPU)

    assert mirror.nbytes == DeviceReplay.bytes_for(300, obs_shape, stack=stack)


def learner_pair(device: str, **changes: object) -> tuple[Learner, Learner]:
    """Two learners from one seed and the same transitions: the host update and the device
    update. A short target period makes both move their targets within a few updates."""
    config = dataclasses.replace(
        LearnerConfig(
            batch_size=32,
            replay_capacity=512,
            learning_starts=64,
            target_update_interval=3,
            device=device,
            sample_block=2,
        ),
        **changes,
    )
    data = transitions(512, seed=7)
    host = Learner(
        obs_shape=OBS, n_actions=2, config=dataclasses.replace(config, device_update="off")
    )
    on_device = Learner(
        obs_shape=OBS, n_actions=2, config=dataclasses.replace(config, device_update="on")
    )
    for learner in (host, on_device):
        learner.add(data)
    return host, on_device


def assert_same_learners(host: Learner, on_device: Learner, *, atol: float) -> None:
    for module in ("online", "target"):
        for (name, a), (_, b) in zip(
            getattr(host, module).named_parameters(),
            getattr(on_device, module).named_parameters(),
            strict=True,
        ):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=f"{module}.{name}")
    host_adam = host.optimizer.state_dict()["state"]
    device_adam = on_device.optimizer.state_dict()["state"]
    for index, state in host_adam.items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(state[key], device_adam[index][key], rtol=1e-5, atol=atol)


@pytest.mark.parametrize("changes", [{}, {"target_update": "polyak", "target_update_interval": 1}])
def test_device_updates_equal_host_updates_from_the_same_draws(
    changes: dict[str, object], one_torch_thread: None
) -> None:
    # prepare
    host, on_device = learner_pair("cpu", **changes)
    assert on_device.on_device and not host.on_device
    captured = on_device._captured
    assert captured is not None
    mirror = on_device.replay.mirror
    assert mirror is not None

    for _ in range(7):
        # act: the device draws; both update from exactly those transitions and weights
        slots, weights = captured.draw()
        captured.update(slots, weights)
        batch = mirror.gather(slots, weights)
        _, _, td_abs = host._step(batch)
        host.replay.update_priorities(slots.numpy(), td_abs.numpy())

        # assert: networks, Adam's moments and the priorities written agree
        assert_same_learners(host, on_device, atol=1e-6)
        expected = (np.abs(td_abs.numpy().astype(np.float64)) + 1e-6) ** 0.6
        written = mirror.priorities.values[slots].numpy()
        last = {int(s): i for i, s in enumerate(slots.tolist())}
        np.testing.assert_allclose(
            written, expected[[last[int(s)] for s in slots.tolist()]], rtol=1e-5
        )


def test_the_device_update_trains_counts_and_reports_as_the_host_update(
    one_torch_thread: None,
) -> None:
    # prepare
    host, on_device = learner_pair("cpu", stats_interval=8)

    # act
    reported = [on_device.train(4) for _ in range(5)]
    host.train(20)

    # assert: statistics come every stats_interval updates; counters and target schedule agree
    assert [bool(r) for r in reported] == [False, True, False, True, False]
    assert set(reported[1]) == {"loss", "q_mean", "td_abs_mean", "updates", "beta"}
    assert on_device.updates == host.updates == 20
    assert on_device.beta() == host.beta()
    assert on_device._target_updated_at == host._target_updated_at
    assert set(on_device.synchronize()) == {"loss", "q_mean", "td_abs_mean", "updates", "beta"}
    assert on_device.synchronize() == {}


def test_device_learner_state_restores_into_a_host_learner_and_back(
    one_torch_thread: None,
) -> None:
    # prepare: a device learner that trained, and a new learner of each kind
    _, on_device = learner_pair("cpu")
    on_device.train(10)
    state = on_device.state_dict()
    fresh_host, fresh_device = learner_pair("cpu")

    # act
    fresh_host.load_state_dict(state)
    fresh_device.load_state_dict(fresh_host.state_dict())
    fresh_device.reconfigure(dataclasses.replace(fresh_device.config, lr=5e-4))
    fresh_device.train(5)

    # assert: the learning rate stays the device tensor the update reads, now 5e-4
    assert state["optimizer"]["param_groups"][0]["lr"] == 1e-3
    assert fresh_host.updates == fresh_device.updates - 5 == 10
    lr = fresh_device.optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.item() == pytest.approx(5e-4)
    assert fresh_device.state_dict()["optimizer"]["param_groups"][0]["lr"] == 5e-4


def test_device_update_on_refuses_data_parallel_ranks_and_other_replays() -> None:
    class Draws:
        def __len__(self) -> int:
            return 0

    with pytest.raises(ValueError, match="device_update on needs one learner"):
        Learner(
            obs_shape=OBS,
            n_actions=2,
            config=LearnerConfig(device_update="on"),
            replay=Draws(),  # type: ignore[arg-type]
        )
    with pytest.raises(ValueError, match="device_update"):
        LearnerConfig(device_update="always")  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_updates_equal_eager_updates_on_cuda() -> None:
    # prepare: three learners from one state: the captured graph, the same device
    # functions run eagerly, and the host update fed the eager one's draws
    changes = {"sample_block": 4, "target_update_interval": 5}
    host, captured_learner = learner_pair("cuda", **changes)
    _, eager_learner = learner_pair("cuda", **changes)
    eager = eager_learner._captured
    mirror = eager_learner.replay.mirror
    assert eager is not None and mirror is not None
    updates = 3 + 2 * 4 + 1  # the warm-up, two 4-update graphs and a 1-update graph

    # act
    captured_learner.train(updates)
    captured_learner.synchronize()
    for _ in range(updates):
        slots, weights = eager.draw()
        eager.update(slots, weights)
        _, _, td_abs = host._step(mirror.gather(slots, weights))
        host.replay.update_priorities(slots.cpu().numpy(), td_abs.cpu().numpy())
    torch.cuda.synchronize()

    # assert
    assert_same_learners(eager_learner, captured_learner, atol=1e-5)
    assert_same_learners(host, eager_learner, atol=1e-5)
    torch.testing.assert_close(
        captured_learner.replay.mirror.priorities.values,  # type: ignore[union-attr]
        mirror.priorities.values,
        rtol=1e-4,
        atol=1e-6,
    )


def test_a_device_learners_weights_reach_the_actors_at_the_count_they_were_taken(
    one_torch_thread: None,
) -> None:
    # prepare: one actor in this process, a device learner that publishes every 4 updates
    engine = TrainingEngine(
        EngineConfig(
            env="CartPole-v1",
            workers=0,
            envs_per_worker=4,
            steps_per_slot=4,
            eval_interval=0,
            weights_interval=4,
        ),
        LearnerConfig(
            device_update="on", learning_starts=64, batch_size=16, hidden=(16,), device="cpu"
        ),
    )
    published = []

    # act
    with engine:
        while engine.counters.updates < 60:
            before = engine._schedule.published_at
            engine.poll()
            schedule = engine._schedule
            if schedule.published_at != before:
                actor = schedule.pool.serial
                assert actor is not None
                published.append(schedule.published_at)
                # assert: the actor holds the learner's weights of the count they were taken at
                assert actor.weights_version == schedule.published_at == engine.learner.updates
                for (_, held), (_, learner) in zip(
                    named_arrays(actor._net), engine.learner.weights(), strict=True
                ):
                    np.testing.assert_array_equal(held, learner)

    assert len(published) >= 3
