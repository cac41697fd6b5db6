"""The participant's side of experience exchange: conversions, pushes, mixing, outbox, RPCs."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedrl.client.federation.experience_client import (
    KIND,
    ExperienceClient,
    Pulled,
    experience_messages,
    queue_experience,
)
from fedrl.client.federation.experience_cursor import CursorFile
from fedrl.client.federation.experience_sync import (
    ExchangeConfig,
    ExperienceSync,
    PacedCredit,
    UnsentTransitions,
)
from fedrl.client.federation.outbox import Outbox
from fedrl.client.federation.outbox_file import Entry
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.experience_conversion import to_experience, to_transitions
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.common.experience import BatchAssembler
from fedrl.common.group_rules import GroupRules
from tests.support.experience import GAMMA, SPEC_HASH, Server, cartpole_spec, make_batch
from tests.support.server_harness import InProcessServer, join, server_config

OBS = (4,)


def _transitions(rows: int, seed: int = 0) -> LearnerTransitions:
    return to_transitions(make_batch(rows, seed=seed))


SMALL = LearnerConfig(device="cpu", learning_starts=64, hidden=(16,), batch_size=32)


def _engine() -> TrainingEngine:
    """A started CartPole engine (its observations are OBS) in the caller's process."""
    engine = TrainingEngine(EngineConfig(workers=0, envs_per_worker=2, eval_interval=0), SMALL)
    engine.start()
    return engine


def _updates_in_one_round(engine: TrainingEngine) -> int:
    return engine.poll().updates


def test_local_batch_converts_to_the_wire_and_back_unchanged() -> None:
    local = _transitions(200)

    wire = to_experience(local, n_step=1, gamma=GAMMA, spec_hash=SPEC_HASH)
    back = to_transitions(wire)

    assert np.array_equal(wire.terminated, local.discount == 0.0)
    assert not wire.truncated.any()
    for name in ("obs", "action", "reward", "next_obs", "discount"):
        np.testing.assert_array_equal(getattr(back, name), getattr(local, name))


def test_foreign_terminated_rows_never_bootstrap() -> None:
    batch = make_batch(100, seed=3)
    index = int(np.flatnonzero(batch.terminated)[0])
    batch.discount[index] = 0.5

    assert to_transitions(batch).discount[index] == 0.0


def test_unsent_transitions_hand_out_every_new_row_once_in_arrival_order() -> None:
    unsent = UnsentTransitions(100, OBS)
    first, second = _transitions(30, seed=1), _transitions(20, seed=2)
    unsent.add(first)
    unsent.add(second)

    taken = unsent.take()
    again = unsent.take()

    assert taken is not None and again is None and len(unsent) == 0
    joined = LearnerTransitions.concat([first, second])
    for name in ("obs", "action", "reward", "next_obs", "discount"):
        np.testing.assert_array_equal(getattr(taken, name), getattr(joined, name), err_msg=name)


def test_unsent_transitions_past_capacity_keep_the_newest_in_order() -> None:
    unsent = UnsentTransitions(50, OBS)
    batches = [_transitions(40, seed=seed) for seed in range(3)]
    for batch in batches:
        unsent.add(batch)

    taken = unsent.take()

    newest = LearnerTransitions.concat(batches).obs[-50:]
    assert taken is not None
    np.testing.assert_array_equal(taken.obs, newest)


def test_rows_recorded_after_a_take_come_with_the_next_one_only() -> None:
    unsent = UnsentTransitions(64, OBS)
    unsent.add(_transitions(64, seed=1))
    unsent.take()
    later = _transitions(10, seed=2)

    unsent.add(later)
    taken = unsent.take()

    assert taken is not None
    np.testing.assert_array_equal(taken.obs, later.obs)


def test_foreign_transitions_join_the_one_replay_flagged_foreign() -> None:
    engine = _engine()
    try:
        while not engine.learner.ready():
            engine.poll()
        local = len(engine.learner.replay)

        engine.add_foreign(_transitions(local, seed=5))
        sampled = engine.learner.replay.sample(512, beta=0.4)
    finally:
        engine.close()

    assert engine.foreign_received == local
    assert 0.3 < sampled.foreign.mean() < 0.7
    assert np.isfinite(engine.learner.train(4)["loss"])


def test_foreign_transitions_earn_the_updates_their_credit_says() -> None:
    # Serial mode: a round trains what is owed, then collects. Two engines on
    # the same seed differ only in what add_foreign gave them.
    with_credit, at_local_pace = _engine(), _engine()
    try:
        for engine in (with_credit, at_local_pace):
            while not engine.learner.ready():
                engine.poll()
            engine.poll()

        with_credit.add_foreign(_transitions(200, seed=5), credit=1.0)
        at_local_pace.add_foreign(_transitions(200, seed=5), credit=0.0)
        extra = _updates_in_one_round(with_credit) - _updates_in_one_round(at_local_pace)
    finally:
        with_credit.close()
        at_local_pace.close()

    # replay_ratio 0.5: 200 foreign transitions at full credit owe 100 updates.
    assert extra == 100


def test_a_learner_fed_foreign_transitions_lengthens_its_target_period() -> None:
    engine = _engine()
    try:
        while not engine.learner.ready():
            engine.poll()
        for _ in range(3):
            engine.poll()
        alone = engine.learner.target_period()
        own = engine.counters.env_steps
        engine.add_foreign(_transitions(3 * own, seed=5))
        engine.poll()
    finally:
        engine.close()

    # Others' transitions at least three times all its own steps: since the
    # replay was ready, over 4 credited per own step, so the period at least doubles.
    assert alone == SMALL.target_update_interval
    assert engine.learner.target_period() >= 2 * SMALL.target_update_interval


def test_foreign_transitions_before_the_replay_is_ready_leave_no_backlog() -> None:
    engine = _engine()
    try:
        engine.add_foreign(_transitions(SMALL.learning_starts, seed=5))
        first = engine.poll().updates
        second = engine.poll().updates
    finally:
        engine.close()

    # The replay was full enough at once; the foreign rows that filled it owe nothing.
    assert first == 0
    assert second <= 0.5 * engine.config.envs_per_worker * engine.config.steps_per_slot + 1


def test_a_ppo_engine_refuses_foreign_transitions() -> None:
    from fedrl.client.training.ppo_learner import PPOConfig  # noqa: PLC0415

    engine = TrainingEngine(
        EngineConfig(workers=0, envs_per_worker=2, eval_interval=0),
        PPOConfig(device="cpu", rollout_steps=8, ppo_hidden=(8,)),
    )
    try:
        with pytest.raises(TypeError, match="only DQN"):
            engine.add_foreign(_transitions(10))
    finally:
        engine.close()


def test_the_session_refuses_a_negative_or_undefined_credit() -> None:
    with pytest.raises(ValueError, match="foreign_credit must be a number in 0"):
        GroupRules(foreign_credit=-0.5)
    with pytest.raises(ValueError, match="round_foreign_credit must be a number in 0"):
        GroupRules(round_foreign_credit=float("nan"))


def test_cursor_file_survives_a_restart_and_a_damaged_one_reads_as_zero(tmp_path: Path) -> None:
    cursor = CursorFile(tmp_path / "sync" / "experience_cursor.json")
    cursor.save(42)

    assert CursorFile(tmp_path / "sync" / "experience_cursor.json").load() == 42
    (tmp_path / "sync" / "experience_cursor.json").write_text("{not json")
    assert cursor.load() == 0


def test_outbox_entries_reach_another_participant_through_a_real_server(
    tmp_path: Path, experience_server: Server
) -> None:
    federation, _ = experience_server.stubs()
    join(federation, "alice", cartpole_spec())
    join(federation, "bob", cartpole_spec())
    outbox = Outbox(tmp_path / "alice-outbox")
    sent = [make_batch(100, seed=s) for s in range(3)]
    for batch in sent:
        queue_experience(outbox, batch, session="default", participant_id="alice")

    pushed, first, second = asyncio.run(_push_then_pull(experience_server.address, outbox))

    assert pushed == 3 and outbox.size(KIND) == (0, 0)
    assert [h.sequence for h, _ in first.batches] == [1, 2]
    assert [h.sequence for h, _ in second.batches] == [3]
    np.testing.assert_array_equal(second.batches[0][1].obs, sent[2].obs)


async def _push_then_pull(address: str, outbox: Outbox) -> tuple[int, Pulled, Pulled]:
    async with grpc.aio.insecure_channel(address) as channel:
        alice = ExperienceClient(channel, participant_id="alice", session="default")
        bob = ExperienceClient(channel, participant_id="bob", session="default")
        pushed = await alice.send_pending(outbox)
        first = await bob.pull(0, max_transitions=200)
        second = await bob.pull(first.next_cursor, max_transitions=200)
    return pushed, first, second


def test_a_refused_entry_is_set_aside_and_the_rest_still_go(
    tmp_path: Path, experience_server: Server
) -> None:
    federation, _ = experience_server.stubs()
    join(federation, "alice", cartpole_spec())
    outbox = Outbox(tmp_path / "alice-outbox")
    bad = make_batch(10)
    bad.action[0] = 5
    queue_experience(outbox, bad, session="default", participant_id="alice")
    queue_experience(outbox, make_batch(10), session="default", participant_id="alice")

    pushed = asyncio.run(_send(experience_server.address, outbox))

    assert pushed == 1 and outbox.size(KIND) == (0, 0)
    assert len(list((tmp_path / "alice-outbox" / "rejected").iterdir())) == 1


async def _send(address: str, outbox: Outbox) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        client = ExperienceClient(channel, participant_id="alice", session="default")
        return await client.send_pending(outbox)


CREDITS = GroupRules(foreign_credit=2.0, round_foreign_credit=4.0)
"""Credits other than one, so that each rule's share of the updates can be told apart."""


def _sync(
    root: Path, pid: str, gamma: float = GAMMA, *, credit_at_own_pace: bool = True
) -> ExperienceSync:
    return ExperienceSync(
        ExchangeConfig(push_transitions=64, pull_transitions=1000),
        rules=CREDITS if credit_at_own_pace else replace(CREDITS, credit_at_own_pace=False),
        obs_shape=OBS,
        n_step=1,
        gamma=gamma,
        spec_hash=SPEC_HASH,
        session="default",
        participant_id=pid,
        cursor=CursorFile(root / pid / "experience_cursor.json"),
    )


async def _exchange_round(address: str, *rounds: tuple[ExperienceSync, str, Outbox]) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        for sync, pid, outbox in rounds:
            client = ExperienceClient(channel, participant_id=pid, session="default")
            await sync.exchange(client, outbox)


def test_experience_sync_moves_recent_transitions_into_the_others_foreign_replay(
    tmp_path: Path,
    experience_server: Server,
) -> None:
    federation, _ = experience_server.stubs()
    join(federation, "alice", cartpole_spec())
    join(federation, "bob", cartpole_spec())
    alice, bob = _sync(tmp_path, "alice"), _sync(tmp_path, "bob")
    alice_outbox, bob_outbox = Outbox(tmp_path / "a-out"), Outbox(tmp_path / "b-out")
    alice.record(_transitions(500))
    alice.queue(alice_outbox)
    engine = _engine()

    try:
        asyncio.run(
            _exchange_round(
                experience_server.address, (alice, "alice", alice_outbox), (bob, "bob", bob_outbox)
            )
        )
        added = bob.adopt(engine)
        asyncio.run(_exchange_round(experience_server.address, (bob, "bob", bob_outbox)))
        again = bob.adopt(engine)
    finally:
        engine.close()

    assert (added, again) == (64, 0)
    assert engine.foreign_received == 64 and len(engine.learner.replay) == 64
    assert CursorFile(tmp_path / "bob" / "experience_cursor.json").load() == 1


def test_paced_credit_grants_each_sender_no_more_than_the_own_rows_so_far() -> None:
    paced = PacedCredit()
    paced.collected(100)

    first = paced.grant("alice", 64)
    second = paced.grant("alice", 64)
    other = paced.grant("carol", 64)
    paced.collected(50)
    later = paced.grant("alice", 64)

    assert (first, second, other, later) == (64, 36, 64, 50)


def _updates_after_one_batch_of_alices(
    tmp_path: Path,
    experience_server: Server,
    receivers: dict[str, tuple[ExperienceSync, bool]],
    *,
    own_rows: int = 0,
) -> tuple[dict[str, int], dict[str, int]]:
    """Alice pushes 64 rows; each receiver (its sync, whether it adopts in rounds), having
    collected `own_rows` of its own, pulls and adopts them into an engine of one seed.
    The rows each adopted and the updates each engine then makes in one round."""
    federation, _ = experience_server.stubs()
    for pid in ("alice", *receivers):
        join(federation, pid, cartpole_spec())
    alice = _sync(tmp_path, "alice")
    alice_outbox = Outbox(tmp_path / "a-out")
    alice.record(_transitions(64))
    alice.queue(alice_outbox)
    if own_rows:
        for receiver, _ in receivers.values():
            receiver.record(_transitions(own_rows, seed=3))
    engines = {pid: _engine() for pid in receivers}
    try:
        for engine in engines.values():
            while not engine.learner.ready():
                engine.poll()
            engine.poll()
        asyncio.run(
            _exchange_round(
                experience_server.address,
                (alice, "alice", alice_outbox),
                *(
                    (sync, pid, Outbox(tmp_path / f"{pid}-out"))
                    for pid, (sync, _) in receivers.items()
                ),
            )
        )
        added = {
            pid: sync.adopt(engines[pid], in_rounds=rounds)
            for pid, (sync, rounds) in receivers.items()
        }
        updates = {pid: _updates_in_one_round(engine) for pid, engine in engines.items()}
    finally:
        for engine in engines.values():
            engine.close()
    return added, updates


def test_a_sender_ahead_of_the_receiver_earns_credit_only_up_to_its_pace(
    tmp_path: Path,
    experience_server: Server,
) -> None:
    # Each receiver has collected 16 rows of its own when 64 of Alice's
    # arrive: paced, 16 of them earn the credit; unpaced, all 64.
    added, updates = _updates_after_one_batch_of_alices(
        tmp_path,
        experience_server,
        {
            "paced": (_sync(tmp_path, "paced"), False),
            "unpaced": (_sync(tmp_path, "unpaced", credit_at_own_pace=False), False),
        },
        own_rows=16,
    )

    # Both replays take all 64; replay_ratio 0.5 at a credit of 2 local steps each: the
    # 48 unpaced rows owe 48 updates.
    assert added == {"paced": 64, "unpaced": 64}
    assert updates["unpaced"] - updates["paced"] == 48


def test_in_rounds_the_others_data_earns_the_round_credit(
    tmp_path: Path,
    experience_server: Server,
) -> None:
    # One adopts Alice's batch as a member syncing asynchronously, the other in rounds.
    added, updates = _updates_after_one_batch_of_alices(
        tmp_path,
        experience_server,
        {
            "apart": (_sync(tmp_path, "apart", credit_at_own_pace=False), False),
            "in-rounds": (_sync(tmp_path, "in-rounds", credit_at_own_pace=False), True),
        },
    )

    # replay_ratio 0.5: 64 rows at the round credit of 4 owe 128 updates, at 2 owe 64.
    assert added == {"apart": 64, "in-rounds": 64}
    assert updates["in-rounds"] - updates["apart"] == 64


def test_foreign_batches_made_with_another_gamma_are_skipped(
    tmp_path: Path,
    experience_server: Server,
) -> None:
    federation, _ = experience_server.stubs()
    join(federation, "alice", cartpole_spec())
    join(federation, "bob", cartpole_spec())
    alice, bob = _sync(tmp_path, "alice", gamma=0.9), _sync(tmp_path, "bob")
    alice_outbox, bob_outbox = Outbox(tmp_path / "a-out"), Outbox(tmp_path / "b-out")
    alice.record(to_transitions(make_batch(100, gamma=0.9)))
    alice.queue(alice_outbox)
    engine = _engine()

    try:
        asyncio.run(
            _exchange_round(
                experience_server.address, (alice, "alice", alice_outbox), (bob, "bob", bob_outbox)
            )
        )
        added = bob.adopt(engine)
    finally:
        engine.close()

    assert added == 0 and engine.foreign_received == 0
    # Skipped for good: the cursor moved past them.
    assert CursorFile(tmp_path / "bob" / "experience_cursor.json").load() == 1


def test_experience_sync_turns_itself_off_against_a_server_without_the_service(
    tmp_path: Path,
) -> None:
    with InProcessServer(server_config(tmp_path / "plain")) as server:
        join(server.stub(), "alice", cartpole_spec())
        syncs: list[tuple[ExperienceSync, Outbox]] = []
        # Many times over: gRPC's asyncio client now and then reports INTERNAL in place of
        # the server's UNIMPLEMENTED (grpc/grpc#36066), about once in 200 pushes here.
        for attempt in range(300):
            sync, outbox = _sync(tmp_path / str(attempt), "alice"), Outbox(tmp_path / f"o{attempt}")
            sync.record(_transitions(100))
            sync.queue(outbox)

            asyncio.run(_exchange_round(server.address, (sync, "alice", outbox)))
            syncs.append((sync, outbox))

    assert not any(sync.enabled for sync, _ in syncs)
    assert all(outbox.size(KIND)[0] == 1 for _, outbox in syncs)


def test_the_probe_after_a_lost_status_tells_a_missing_service_from_a_present_one(
    tmp_path: Path,
    experience_server: Server,
) -> None:
    join(experience_server.stubs()[0], "alice", cartpole_spec())

    async def missing(address: str) -> bool:
        async with grpc.aio.insecure_channel(address) as channel:
            client = ExperienceClient(channel, participant_id="alice", session="default")
            return await client._service_missing()

    with InProcessServer(server_config(tmp_path / "plain")) as plain:
        join(plain.stub(), "alice", cartpole_spec())
        without = asyncio.run(missing(plain.address))
    present = asyncio.run(missing(experience_server.address))

    assert (without, present) == (True, False)


def test_consecutive_pushes_never_repeat_a_transition(tmp_path: Path) -> None:
    sync, outbox = _sync(tmp_path, "alice"), Outbox(tmp_path / "out")
    sync.record(_transitions(40, seed=1))
    first = sync.queue(outbox)
    nothing_new = sync.queue(outbox)
    sync.record(_transitions(30, seed=2))

    second = sync.queue(outbox)

    assert first is not None and second is not None and nothing_new is None
    pushed = [_pushed_obs(entry) for entry in (first, second)]
    np.testing.assert_array_equal(pushed[0], _transitions(40, seed=1).obs)
    np.testing.assert_array_equal(pushed[1], _transitions(30, seed=2).obs)
    assert outbox.size(KIND)[0] == 2


def _pushed_obs(entry: Entry) -> np.ndarray:
    messages = experience_messages(entry)
    assembler = BatchAssembler(messages[0].header)
    for message in messages[1:]:
        assembler.add(message.chunk)
    return assembler.result().obs
