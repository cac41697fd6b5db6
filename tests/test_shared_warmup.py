"""Shared warmup: members sync in rounds until their learners start, so that the group's
experience fills every replay together; alone it changes nothing; then the plan's mode."""

from __future__ import annotations

import dataclasses
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.federation.sync_state import NamedArrays
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.common.config_cli import config_from_options
from fedrl.common.group_rules import ROUND_STEPS as DEFAULT_ROUND_STEPS
from fedrl.common.group_rules import ROUND_WAIT_S, RuleChoices
from tests.support.experience import Server
from tests.support.offline import assert_same_weights, offline_weights
from tests.support.participant import participant
from tests.test_sync_rounds import ENGINE, ROUND_STEPS, ROUNDS_SERVER, rounds_server, versions

LEARNING_STARTS = 256
"""Eight polls of a serial engine (32 env steps a poll) to fill a replay alone."""
LEARNER = LearnerConfig(
    hidden=(32, 32),
    learning_starts=LEARNING_STARTS,
    batch_size=32,
    target_update_interval=50,
    device="cpu",
)
WARMUP_THEN_ASYNC = RuleChoices(
    sync_interval=1,
    sync_steps=ROUND_STEPS,
    round_wait_s=20.0,
    rounds_from=1_000,
    delta_dtype="float32",
)
"""The command's default shape for a pair (asynchronous after a warmup in rounds), in the
test's units: rounds from more members than the test has."""


def exchange_server(tmp_path: Path) -> Server:
    """rounds_server's settings, with the experience service."""
    return Server(tmp_path / "server", **ROUNDS_SERVER)


@dataclasses.dataclass
class Trace:
    """Per poll of one member: its env steps, sync mode, and whether its learner had started."""

    env_steps: list[int] = dataclasses.field(default_factory=list)
    modes: list[str] = dataclasses.field(default_factory=list)
    learning: list[bool] = dataclasses.field(default_factory=list)

    @property
    def started_at(self) -> int:
        """Own env steps when the learner started."""
        return self.env_steps[self.learning.index(True)]


def train(
    engine: TrainingEngine, loop: SyncLoop, polls: int, trace: Trace, errors: list[Exception]
) -> None:
    try:
        for _ in range(polls):
            loop.after_poll(engine.poll())
            trace.env_steps.append(engine.counters.env_steps)
            trace.modes.append(loop.sync_mode)
            trace.learning.append(engine.learning_started)
        loop.finish(flush_timeout_s=20.0)
    except Exception as exc:  # reported by the test's thread join
        errors.append(exc)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_pair_fills_its_replays_together_then_syncs_asynchronously(tmp_path: Path) -> None:
    # prepare: two members that would each need 256 env steps of their own to start learning
    records: dict[str, list[dict[str, Any]]] = {"ann": [], "bob": []}
    traces = {"ann": Trace(), "bob": Trace()}
    errors: list[Exception] = []
    with ExitStack() as stack:
        server = stack.enter_context(exchange_server(tmp_path))
        members = {
            name: stack.enter_context(
                participant(
                    server.address,
                    tmp_path / name,
                    name,
                    seed=seed,
                    records=records[name],
                    engine_config=ENGINE,
                    learner=LEARNER,
                    rules=WARMUP_THEN_ASYNC,
                )
            )
            for name, seed in (("ann", 1), ("bob", 2))
        }
        assert [loop.sync_mode for _, loop in members.values()] == ["warmup", "warmup"]

        # act
        threads = [
            threading.Thread(target=train, args=(*members[name], 24, traces[name], errors))
            for name in members
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=240)
        assert not any(t.is_alive() for t in threads), "a member never finished"
        assert not errors, errors
        made = versions(server)

    # assert: each learner started on the pair's transitions well before its own steps alone
    # would have filled its replay; the warmup's versions each held both members' pushes;
    # after the warmup both synced asynchronously
    for name, trace in traces.items():
        assert trace.started_at <= LEARNING_STARTS * 3 // 4, (name, trace.env_steps)
        assert members[name][0].foreign_received > 0, name
        first_async = trace.modes.index("async")
        assert set(trace.modes[:first_async]) == {"warmup"}, trace.modes
        assert set(trace.modes[first_async:]) == {"async"}, trace.modes
        assert members[name][1].late_rounds == 0, name
    warmup_versions = [v for v in made if 2 <= v.version <= 3]
    assert [sorted(v.contributors) for v in warmup_versions] == [["ann", "bob"]] * 2, [
        list(v.contributors) for v in made
    ]


@pytest.mark.usefixtures("one_torch_thread")
def test_a_lone_member_warming_up_trains_exactly_as_it_would_offline(tmp_path: Path) -> None:
    # prepare: the same engine offline, then alone in a session, warmup rounds then asynchronous
    polls = 20
    expected = offline_weights(ENGINE, LEARNER, polls)
    records: list[dict[str, Any]] = []
    got: list[NamedArrays] = []
    modes: list[str] = []
    with (
        rounds_server(tmp_path) as server,
        participant(
            server.address,
            tmp_path / "ann",
            "ann",
            seed=ENGINE.seed,
            records=records,
            engine_config=ENGINE,
            learner=LEARNER,
            rules=WARMUP_THEN_ASYNC,
        ) as (engine, loop),
    ):
        # act
        for _ in range(polls):
            loop.after_poll(engine.poll())
            got.append(engine.weights())
            modes.append(loop.sync_mode)
        loop.finish()

    # assert: it warmed up in rounds and went on asynchronously, and not one weight moved
    # apart from offline's
    assert modes[0] == "warmup" and modes[-1] == "async", modes
    adopted = [r for r in records if r["kind"] == "adopt"]
    assert adopted and all(r["change_norm"] < 1e-5 for r in adopted)
    assert_same_weights(expected, got)


def test_the_commands_default_warms_up_in_float32_rounds_of_128_steps() -> None:
    plan = TrainConfig().sync_plan()

    assert plan.warmup is not None
    warmup = plan.warmup
    assert (warmup.interval.episodes, warmup.interval.env_steps) == (0, DEFAULT_ROUND_STEPS)
    assert (warmup.round_wait_s, warmup.delta_dtype) == (ROUND_WAIT_S, "float32")
    assert [plan.mode(n, learning=False).rounds for n in (0, 1, 4)] == [True, True, True]
    assert [plan.mode(n).rounds for n in (0, 1)] == [False, False]


def test_a_plan_with_rounds_warms_up_in_its_own_rounds() -> None:
    options = {"round_wait_s": 2.5, "rounds_from": 3, "sync_steps": 64}
    plan = config_from_options(TrainConfig, options).sync_plan()

    assert plan.warmup == plan.rounds
    assert plan.mode(1, learning=False) == plan.rounds
    assert not plan.mode(1).rounds


@pytest.mark.parametrize(
    "options",
    [
        {"shared_warmup": False},
        {"share": "weights"},
        {"share": "experience"},
        {"algo": "ppo"},
    ],
)
def test_no_warmup_where_it_is_turned_off_or_no_experience_fills_the_replays(
    options: dict[str, Any],
) -> None:
    assert config_from_options(TrainConfig, options).sync_plan().warmup is None


def test_an_acting_member_never_warms_up(tmp_path: Path) -> None:
    # An actor's engine never starts a learner: warming up would last for ever.
    with (
        rounds_server(tmp_path) as server,
        participant(
            server.address,
            tmp_path / "act",
            "act",
            learn=False,
            engine_config=ENGINE,
            learner=LEARNER,
            rules=WARMUP_THEN_ASYNC,
        ) as (_, loop),
    ):
        assert loop.sync_mode == "async"
