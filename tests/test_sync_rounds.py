"""Synchronous rounds through a real server: each version holds one push of every member,
a member that leaves holds nobody up, and a lone member stays lossless."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import pytest

from fedrl.client.commands.config import TrainConfig
from fedrl.client.federation.sync_loop import SyncLoop
from fedrl.client.federation.sync_state import NamedArrays
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.common.config_cli import config_from_options
from fedrl.common.group_rules import DeltaDtype, RuleChoices
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.offline import assert_same_weights, offline_weights
from tests.support.participant import participant
from tests.support.server_harness import InProcessServer, server_config

SMALL = LearnerConfig(
    hidden=(32, 32), learning_starts=64, batch_size=32, target_update_interval=50, device="cpu"
)
ENGINE = EngineConfig(workers=0, envs_per_worker=4, eval_interval=0, seed=3)
"""Serial engines of 4 envs x 8 steps: 32 env steps a round, so --sync-steps 32 syncs in
nearly every round."""
ROUND_STEPS = 32


ROUNDS_SERVER: dict[str, Any] = {
    "buffer_timeout_s": 60.0,
    "global_eval_interval": 0,
    "push_rate_per_s": 1000.0,
    "push_burst": 1000,
}
"""Server settings for rounds: a buffer timeout far beyond the tests' rounds, so a version
made of fewer than every member's push could only come from the automatic K itself."""


def rounds_server(tmp_path: Path) -> InProcessServer:
    return InProcessServer(server_config(tmp_path / "server", **ROUNDS_SERVER))


def member(
    address: str,
    state_dir: Path,
    participant_id: str,
    *,
    seed: int,
    records: list[dict[str, Any]],
    delta_dtype: DeltaDtype = "bfloat16",
) -> AbstractContextManager[tuple[TrainingEngine, SyncLoop]]:
    """A participant syncing in rounds of ROUND_STEPS env steps, each waiting up to 20 s."""
    return participant(
        address,
        state_dir,
        participant_id,
        seed=seed,
        records=records,
        engine_config=ENGINE,
        learner=SMALL,
        rules=RuleChoices(
            round_wait_s=20.0, sync_steps=ROUND_STEPS, rounds_from=1, delta_dtype=delta_dtype
        ),
    )


def run_rounds(
    engine: TrainingEngine,
    loop: SyncLoop,
    polls: int,
    errors: list[Exception],
    in_rounds: list[bool],
) -> None:
    """Train `polls` rounds, noting after each whether it synced in rounds, then push what is
    left and leave (finish)."""
    try:
        for _ in range(polls):
            loop.after_poll(engine.poll())
            in_rounds.append(loop.in_rounds)
        loop.finish(flush_timeout_s=20.0)
    except Exception as exc:  # reported by the test's thread join
        errors.append(exc)


def run_together(*plans: tuple[TrainingEngine, SyncLoop, int]) -> list[list[bool]]:
    """Each member's polls on a thread of its own; per member, whether each poll was in rounds."""
    errors: list[Exception] = []
    in_rounds: list[list[bool]] = [[] for _ in plans]
    threads = [
        threading.Thread(target=run_rounds, args=(engine, loop, polls, errors, flags))
        for (engine, loop, polls), flags in zip(plans, in_rounds, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a member never finished its rounds"
    assert not errors, errors
    return in_rounds


def versions(server: InProcessServer) -> list[pb.VersionState]:
    status = server.stub().Status(pb.StatusRequest(session="default", max_versions=10_000))
    return sorted(status.sessions[0].versions, key=lambda v: v.version)


@pytest.mark.usefixtures("one_torch_thread")
def test_every_version_of_a_round_holds_one_push_from_each_member(tmp_path: Path) -> None:
    # prepare: two members in synchronous rounds, each on its own thread
    records: dict[str, list[dict[str, Any]]] = {"ann": [], "bob": []}
    with ExitStack() as stack:
        server = stack.enter_context(rounds_server(tmp_path))
        ann = stack.enter_context(
            member(server.address, tmp_path / "ann", "ann", seed=1, records=records["ann"])
        )
        bob = stack.enter_context(
            member(server.address, tmp_path / "bob", "bob", seed=2, records=records["bob"])
        )

        # act
        run_together((*ann, 40), (*bob, 40))
        made = versions(server)

    # assert: after the first (one member pushed before the other had), each
    # version until the members finish holds exactly one update of each, and
    # both adopted each of those versions in the round it formed
    rounds = [v for v in made if v.version >= 1]
    assert len(rounds) >= 25
    middle = rounds[1:-2]
    assert all(sorted(v.contributors) == ["ann", "bob"] for v in middle), [
        list(v.contributors) for v in rounds
    ]
    for name, loop in (("ann", ann[1]), ("bob", bob[1])):
        adopted = {r["version"] for r in records[name] if r["kind"] == "adopt"}
        assert {v.version for v in middle} <= adopted, name
        assert loop.late_rounds == 0, name


@pytest.mark.usefixtures("one_torch_thread")
def test_a_member_that_leaves_holds_no_round_of_the_others_up(tmp_path: Path) -> None:
    # prepare: bob trains a few rounds and leaves; ann goes on alone
    records: list[dict[str, Any]] = []
    with ExitStack() as stack:
        server = stack.enter_context(rounds_server(tmp_path))
        ann = stack.enter_context(
            member(server.address, tmp_path / "ann", "ann", seed=1, records=records)
        )
        bob = stack.enter_context(
            member(server.address, tmp_path / "bob", "bob", seed=2, records=[])
        )

        # act
        run_together((*ann, 40), (*bob, 10))
        made = versions(server)

    # assert: no round of ann's waited out its bound (60 s of buffer timeout
    # would have, had the server kept counting bob), and her rounds after
    # bob left made versions of her pushes alone
    assert ann[1].late_rounds == 0
    alone = [v for v in made if list(v.contributors) == ["ann"]]
    assert len(alone) >= 15
    assert made[-1].contributors == ["ann"]


@pytest.mark.usefixtures("one_torch_thread")
def test_a_lone_member_in_rounds_trains_exactly_as_it_would_offline(tmp_path: Path) -> None:
    # prepare: the same engine offline, then alone in a session syncing in rounds
    rounds = 40
    expected = offline_weights(ENGINE, SMALL, rounds)
    records: list[dict[str, Any]] = []
    got: list[NamedArrays] = []
    with (
        rounds_server(tmp_path) as server,
        member(
            server.address,
            tmp_path / "ann",
            "ann",
            seed=ENGINE.seed,
            records=records,
            delta_dtype="float32",
        ) as (engine, loop),
    ):
        # act
        for _ in range(rounds):
            loop.after_poll(engine.poll())
            got.append(engine.weights())
        loop.finish()

    # assert: a version in nearly every round, each adopted in its round, and
    # not one weight apart from offline's
    adopted = [r for r in records if r["kind"] == "adopt"]
    assert len(adopted) >= rounds - 5
    assert loop.late_rounds == 0
    assert all(r["change_norm"] < 1e-5 for r in adopted)
    assert_same_weights(expected, got)


@pytest.mark.usefixtures("one_torch_thread")
def test_members_move_to_rounds_when_the_session_reaches_the_plans_size(tmp_path: Path) -> None:
    # prepare: ann and bob sync asynchronously while they are two; rounds from three
    rules = RuleChoices(
        sync_interval=1,
        sync_steps=ROUND_STEPS,
        round_wait_s=20.0,
        rounds_from=3,
        shared_warmup=False,
    )
    records: dict[str, list[dict[str, Any]]] = {"ann": [], "bob": [], "carl": []}

    def join(name: str, seed: int) -> tuple[TrainingEngine, SyncLoop]:
        return stack.enter_context(
            participant(
                server.address,
                tmp_path / name,
                name,
                seed=seed,
                records=records[name],
                engine_config=ENGINE,
                learner=SMALL,
                rules=rules,
            )
        )

    with ExitStack() as stack:
        server = stack.enter_context(rounds_server(tmp_path))
        ann, bob = join("ann", 1), join("bob", 2)
        for _ in range(30):
            for engine, loop in (ann, bob):
                loop.after_poll(engine.poll())
        two = (ann[1].in_rounds, bob[1].in_rounds)

        # act: carl joins, and the three train on together
        carl = join("carl", 3)
        in_rounds = run_together((*ann, 40), (*bob, 40), (*carl, 40))

    # assert: asynchronous as two; as three, in rounds once the server's count
    # of pushing members reached each (a version after carl's first push), and
    # none of the rounds late
    assert two == (False, False)
    assert [flags[20:30] for flags in in_rounds] == [[True] * 10] * 3, in_rounds
    assert all(loop.late_rounds == 0 for _, loop in (ann, bob, carl))


def test_the_commands_default_syncs_in_float32_rounds_from_two_members_pushing() -> None:
    default = TrainConfig().sync_plan()
    rounds = config_from_options(TrainConfig, {"rounds_from": 1}).sync_plan()
    asynchronous = config_from_options(TrainConfig, {"round_wait_s": 0.0}).sync_plan()

    assert [default.mode(n).rounds for n in (0, 1, 2, 3, 4)] == [False, False, True, True, True]
    alone = default.mode(1)
    assert (alone.interval.episodes, alone.interval.env_steps, alone.delta_dtype) == (
        2,
        0,
        "bfloat16",
    )
    group = default.mode(4)
    assert (group.interval.episodes, group.interval.env_steps) == (0, 128)
    assert (group.round_wait_s, group.delta_dtype) == (5.0, "float32")
    assert [rounds.mode(n).rounds for n in (0, 1, 4)] == [True, True, True]
    assert [asynchronous.mode(n).rounds for n in (0, 1, 4)] == [False, False, False]
    assert [p.follows_the_group for p in (default, rounds, asynchronous)] == [True, False, False]


@pytest.mark.parametrize(
    ("options", "modes"),
    [
        ({"share": "experience"}, [(0.0, 2, 0, "bfloat16")] * 2),
        ({"algo": "ppo"}, [(0.0, 2, 0, "bfloat16")] * 2),
        ({"sync_steps": 256}, [(5.0, 0, 256, "float32")] * 2),
        ({"round_wait_s": 0.0}, [(0.0, 2, 0, "bfloat16")] * 2),
        ({"round_wait_s": 5.0, "rounds_from": 1, "sync_steps": 64}, [(5.0, 0, 64, "float32")] * 2),
        (
            {"round_wait_s": 5.0, "rounds_from": 3, "sync_steps": 64},
            [(0.0, 2, 64, "bfloat16"), (5.0, 0, 64, "float32")],
        ),
        (
            {"round_wait_s": 2.5, "rounds_from": 3, "delta_dtype": "float16"},
            [(0.0, 2, 0, "float16"), (2.5, 0, 128, "float16")],
        ),
    ],
)
def test_given_sync_options_stand_and_the_rest_follow_the_mode(
    options: dict[str, Any], modes: list[tuple[float, int, int, str]]
) -> None:
    plan = config_from_options(TrainConfig, options).sync_plan()

    got = [
        (m.round_wait_s, m.interval.episodes, m.interval.env_steps, m.delta_dtype)
        for m in (plan.mode(2), plan.mode(4))
    ]
    assert got == modes


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"round_wait_s": 5.0, "share": "experience"}, "--share weights or both"),
        ({"round_wait_s": 5.0, "algo": "ppo"}, "DQN"),
        ({"round_wait_s": 5.0, "sync_steps": 0}, "give --sync-steps"),
        ({"rounds_from": 0}, "rounds_from must be a whole number in 1"),
    ],
)
def test_rounds_asked_for_where_they_cannot_form_are_refused(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        config_from_options(TrainConfig, options)
