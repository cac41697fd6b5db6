"""The participant's side of experience exchange: conversions, pushes, mixing, outbox, RPCs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

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
    UnsentTransitions,
    mixed_replay,
)
from fedrl.client.federation.outbox import Entry, Outbox
from fedrl.client.training.experience_conversion import to_experience, to_transitions
from fedrl.client.training.learner import Learner, LearnerConfig
from fedrl.client.training.mixed_replay import MixedReplay
from fedrl.client.training.replay import PrioritizedReplay
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.common.experience import BatchAssembler
from tests.support.experience import GAMMA, SPEC_HASH, Server, cartpole_spec, make_batch
from tests.support.server_harness import InProcessServer, join, server_config

OBS = (4,)


def _transitions(rows: int, seed: int = 0) -> LearnerTransitions:
    return to_transitions(make_batch(rows, seed=seed))


def _replay(capacity: int, seed: int) -> PrioritizedReplay:
    return PrioritizedReplay(capacity, OBS, seed=seed)


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


def test_mixed_replay_draws_the_foreign_share_and_flags_it() -> None:
    mixed = MixedReplay(_replay(500, 0), _replay(500, 1), foreign_share=0.25, gamma=GAMMA)
    mixed.add(_transitions(300))
    mixed.add_pulled(make_batch(300, seed=5))

    sampled = mixed.sample(64, beta=0.4)

    assert int(sampled.foreign.sum()) == 16
    assert (sampled.indices[sampled.foreign] >= 500).all()
    assert (sampled.indices[~sampled.foreign] < 500).all()


def test_mixed_replay_sends_priorities_back_to_their_own_replay() -> None:
    local, foreign = _replay(100, 0), _replay(100, 1)
    mixed = MixedReplay(local, foreign, foreign_share=0.5, gamma=GAMMA)
    mixed.add(_transitions(100))
    mixed.add_pulled(make_batch(100, seed=5))
    sampled = mixed.sample(8, beta=0.4)

    mixed.update_priorities(sampled.indices, np.full(8, 1000.0))

    foreign_slot = int(sampled.indices[sampled.foreign][0]) - 100
    drawn = [int(s) for s in foreign.sample(64, beta=0.4).indices]
    assert drawn.count(foreign_slot) > 1


def test_mixed_replay_without_foreign_data_draws_only_local() -> None:
    mixed = MixedReplay(_replay(100, 0), _replay(100, 1), foreign_share=0.5, gamma=GAMMA)
    mixed.add(_transitions(100))

    assert not mixed.sample(32, beta=0.4).foreign.any()


def test_foreign_batches_of_another_gamma_are_skipped() -> None:
    mixed = MixedReplay(_replay(100, 0), _replay(100, 1), foreign_share=0.5, gamma=GAMMA)

    added = mixed.add_pulled(make_batch(10, gamma=0.9))

    assert not added and len(mixed) == 0


def test_learner_trains_on_a_mixed_replay() -> None:
    config = LearnerConfig(device="cpu", learning_starts=64, hidden=(16,), batch_size=32)
    mixed = mixed_replay(config, OBS, ExchangeConfig(foreign_share=0.5))
    learner = Learner(obs_shape=OBS, n_actions=2, config=config, replay=mixed)
    learner.add(_transitions(100))
    mixed.add_pulled(make_batch(100, seed=1))

    stats = learner.train(8)

    assert np.isfinite(stats["loss"]) and learner.updates == 8
    assert len(mixed.local) == 100 and len(mixed.foreign) == 100
    assert torch.isfinite(next(learner.online.parameters())).all()


def test_exchange_config_refuses_an_all_foreign_share() -> None:
    with pytest.raises(ValueError, match="some of its own data"):
        ExchangeConfig(foreign_share=1.0)


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


def _sync(root: Path, pid: str, share: float = 0.25) -> ExperienceSync:
    return ExperienceSync(
        ExchangeConfig(foreign_share=share, push_transitions=64, pull_transitions=1000),
        obs_shape=OBS,
        n_step=1,
        gamma=GAMMA,
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
    replay = MixedReplay(_replay(100, 0), _replay(1000, 1), foreign_share=0.25, gamma=GAMMA)

    asyncio.run(
        _exchange_round(
            experience_server.address, (alice, "alice", alice_outbox), (bob, "bob", bob_outbox)
        )
    )
    added = bob.adopt(replay)
    asyncio.run(_exchange_round(experience_server.address, (bob, "bob", bob_outbox)))
    again = bob.adopt(replay)

    assert (added, again) == (64, 0)
    assert len(replay.foreign) == 64 and len(replay.local) == 0
    assert CursorFile(tmp_path / "bob" / "experience_cursor.json").load() == 1


def test_experience_sync_turns_itself_off_against_a_server_without_the_service(
    tmp_path: Path,
) -> None:
    with InProcessServer(server_config(tmp_path / "plain")) as server:
        join(server.stub(), "alice", cartpole_spec())
        sync, outbox = _sync(tmp_path, "alice"), Outbox(tmp_path / "a-out")
        sync.record(_transitions(100))
        sync.queue(outbox)

        asyncio.run(_exchange_round(server.address, (sync, "alice", outbox)))

    assert not sync.enabled
    assert outbox.size(KIND)[0] == 1


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


def test_a_zero_share_exchanges_nothing(tmp_path: Path) -> None:
    sync = _sync(tmp_path, "alice", share=0.0)
    sync.record(_transitions(100))

    assert sync.queue(Outbox(tmp_path / "out")) is None
