"""bench.federation_sim: who receives what and when, the figures over seeds, one short run."""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

import numpy as np
import pytest

import bench.federation_sim
from bench.federation.settings import TASKS
from fedrl.client.training.transitions import LearnerTransitions


@pytest.fixture
def sim() -> ModuleType:
    return bench.federation_sim


def batch(rows: int, reward: float) -> LearnerTransitions:
    return LearnerTransitions(
        obs=np.zeros((rows, 4), dtype=np.float32),
        action=np.zeros(rows, dtype=np.int64),
        reward=np.full(rows, reward, dtype=np.float32),
        next_obs=np.zeros((rows, 4), dtype=np.float32),
        discount=np.full(rows, 0.97, dtype=np.float32),
    )


def test_a_batch_reaches_the_other_learners_after_the_delay_and_never_its_sender(
    sim: ModuleType,
) -> None:
    exchange = sim.Exchange([True, True, False], delay=2)
    exchange.send(0, batch(3, reward=1.0))
    received: dict[int, list[list[LearnerTransitions]]] = {0: [], 1: [], 2: []}
    for _ in range(5):
        exchange.round_index += 1
        for receiver, rounds in received.items():
            rounds.append(list(exchange.due(receiver)))
    # Sent in round 0, delay 2: played before round 3, once.
    assert [len(r) for r in received[1]] == [0, 0, 1, 0, 0]
    assert received[1][2][0].reward[0] == 1.0
    assert all(not r for r in received[0])  # the sender
    assert all(not r for r in received[2])  # an actor learns nothing from it


def test_without_delay_a_batch_is_there_before_the_next_round(sim: ModuleType) -> None:
    exchange = sim.Exchange([True, True], delay=0)
    exchange.send(1, batch(2, reward=0.5))
    assert list(exchange.due(0)) == []
    exchange.round_index += 1
    (got,) = list(exchange.due(0))
    assert len(got) == 2


def test_the_mean_model_averages_every_tensor(sim: ModuleType) -> None:
    a = [("w", np.array([1.0, 2.0], dtype=np.float32)), ("b", np.array([0.0], dtype=np.float32))]
    b = [("w", np.array([3.0, 6.0], dtype=np.float32)), ("b", np.array([1.0], dtype=np.float32))]
    mean = sim.mean_weights([a, b])
    assert [name for name, _ in mean] == ["w", "b"]
    np.testing.assert_allclose(mean[0][1], [2.0, 4.0])
    np.testing.assert_allclose(mean[1][1], [0.5])


def summary_run(
    sim: ModuleType, arrangement: str, seed: int, reached: int | None, n: int = 2
) -> object:
    return sim.SimRun(
        arrangement=arrangement,
        n=n,
        seed=seed,
        returns=[100.0, 200.0],
        budget=12_000,
        reached=reached,
        updates_per_step=0.5,
        cpu_seconds=1.0,
        foreign_received=0,
    )


def test_speed_ups_are_ratios_of_iqms_against_offline_with_unsolved_seeds_at_the_budget(
    sim: ModuleType,
) -> None:
    runs = [
        summary_run(sim, "offline", 0, 8_000, n=1),
        summary_run(sim, "offline", 1, 6_000, n=1),
        summary_run(sim, "offline", 2, None, n=1),
        summary_run(sim, "roles", 0, 2_000),
        summary_run(sim, "roles", 1, 3_000),
        summary_run(sim, "roles", 2, 4_000),
        summary_run(sim, "wide", 0, None),
        summary_run(sim, "wide", 1, None),
        summary_run(sim, "wide", 2, 1_000),
    ]
    offline, roles, wide = sim.summarise(runs)
    # Fewer than four seeds: the IQM cuts nothing, the unsolved seed counts at 12,000.
    assert (offline.arrangement, offline.solved, offline.steps.value) == ("offline", 2, 26_000 / 3)
    assert (roles.solved, roles.steps.value) == (3, 3_000)
    assert roles.speedup.value == pytest.approx(26_000 / 9_000)
    assert (wide.solved, wide.steps.value) == (1, 25_000 / 3)
    assert wide.speedup.gain == "no measurable gain"


def test_a_short_run_of_roles_feeds_the_learner_and_scores_every_mark(
    sim: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent_to_learner: list[tuple[int, int]] = []  # (round sent, transitions)

    class CountingExchange(sim.Exchange):
        def send(self, sender: int, batch: LearnerTransitions) -> None:
            if sender != 0:
                sent_to_learner.append((self.round_index, len(batch)))
            super().send(sender, batch)

    monkeypatch.setattr(sim, "Exchange", CountingExchange)
    settings = sim.SimSettings(
        task=replace(TASKS["cartpole"], budget_steps=1_536, eval_every=512),
        n=2,
        eval_episodes=2,
    )
    roles = sim.run("roles", 0, settings)
    last_round = max(sent for sent, _ in sent_to_learner)
    delivered = sum(n for sent, n in sent_to_learner if sent < last_round)
    experience = sim.run("experience", 0, settings)
    wide = sim.run("wide", 0, settings)
    assert len(roles.returns) == len(experience.returns) == len(wide.returns) == 3
    # Every transition the actor sent reached the learner before its next
    # round, so only the last round's are still on their way...
    assert roles.foreign_received > 0
    assert roles.foreign_received == delivered
    # ...and it trained nothing: the pair's mean updates per step is half that
    # of a pair where both learn from the same amount of data.
    assert roles.updates_per_step > 0
    assert roles.updates_per_step == pytest.approx(experience.updates_per_step / 2, rel=0.2)
    assert wide.foreign_received == 0 and wide.n == 2


def test_bad_settings_are_refused(sim: ModuleType) -> None:
    with pytest.raises(ValueError, match="n must be at least 1"):
        sim.SimSettings(n=0)
    with pytest.raises(ValueError, match="every"):
        sim.SimSettings(every=0)
    with pytest.raises(ValueError, match=r"offline budget \(100\) must hold at least one mark"):
        sim.SimSettings(offline_budget=100)


def test_a_learner_field_the_learner_lacks_is_refused(sim: ModuleType) -> None:
    with pytest.raises(ValueError, match="no field"):
        sim.SimSettings(learner=(("nonsense", "1"),))
