"""The Federation service over real gRPC on 127.0.0.1: aggregation, errors, pull, watch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from tests.support.server_harness import (
    InProcessServer,
    channel,
    join,
    make_spec,
    metadata,
    pull,
    push,
    seed,
    server_config,
    update_messages,
)

SPEC = make_spec([(3, 2), (2,)])
INITIAL = [np.arange(6, dtype=np.float32).reshape(3, 2), np.array([1.0, -1.0], np.float32)]


@pytest.fixture
def server(start_server: Callable[..., InProcessServer]) -> InProcessServer:
    return start_server(buffer_size=2)


def seeded(server: InProcessServer, *participants: str) -> pb_grpc.FederationStub:
    stub = server.stub()
    for pid in participants:
        join(stub, pid, SPEC)
    seed(stub, participants[0], SPEC, INITIAL)
    return stub


def code_of(call: object) -> grpc.StatusCode:
    assert isinstance(call, grpc.RpcError)
    return call.code()


def test_two_pushes_give_the_hand_computed_weighted_average(server: InProcessServer) -> None:
    stub = seeded(server, "alice", "bob")
    delta_a = [np.full((3, 2), 1.0, np.float32), np.array([2.0, 0.0], np.float32)]
    delta_b = [np.full((3, 2), -2.0, np.float32), np.array([0.0, 4.0], np.float32)]

    push(stub, "alice", SPEC, delta_a, sequence=1, base_version=0, samples=100)
    push(stub, "bob", SPEC, delta_b, sequence=1, base_version=0, samples=300)
    server.call(_until_version(server, 1))
    header, tensors, _ = pull(stub)

    # Both fresh (staleness 0): weights 100 and 300, server_lr 1.
    expected = [
        g + (100 * a + 300 * b) / 400 for g, a, b in zip(INITIAL, delta_a, delta_b, strict=True)
    ]
    assert header.version == 1 and not header.is_delta
    for got, want in zip(tensors, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_one_participants_buffered_increments_add_up(server: InProcessServer) -> None:
    stub = seeded(server, "alice")
    first = [np.full((3, 2), 1.0, np.float32), np.array([2.0, 0.0], np.float32)]
    second = [np.full((3, 2), 0.5, np.float32), np.array([0.0, -1.0], np.float32)]

    push(stub, "alice", SPEC, first, sequence=1, base_version=0, samples=100)
    push(stub, "alice", SPEC, second, sequence=2, base_version=0, samples=300)
    server.call(_until_version(server, 1))
    _, tensors, _ = pull(stub)

    # Incremental deltas of one participant: the new global holds both in full.
    for got, g, a, b in zip(tensors, INITIAL, first, second, strict=True):
        np.testing.assert_allclose(got, g + a + b, rtol=1e-6)


def test_participants_are_averaged_after_their_increments_are_summed(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data", buffer_size=3)) as server:
        stub = seeded(server, "alice", "bob")
        a1 = [np.full((3, 2), 1.0, np.float32), np.array([1.0, 1.0], np.float32)]
        a2 = [np.full((3, 2), 2.0, np.float32), np.array([0.0, 2.0], np.float32)]
        b1 = [np.full((3, 2), -4.0, np.float32), np.array([4.0, 0.0], np.float32)]

        push(stub, "alice", SPEC, a1, sequence=1, base_version=0, samples=100)
        push(stub, "alice", SPEC, a2, sequence=2, base_version=0, samples=100)
        push(stub, "bob", SPEC, b1, sequence=1, base_version=0, samples=200)
        server.call(_until_version(server, 1))
        _, tensors, _ = pull(stub)

    # alice: a1 + a2 with weight 100 + 100; bob: b1 with weight 200.
    for got, g, x, y, b in zip(tensors, INITIAL, a1, a2, b1, strict=True):
        np.testing.assert_allclose(got, g + (200 * (x + y) + 200 * b) / 400, rtol=1e-6)


def test_automatic_k_makes_every_update_of_a_lone_participant_a_version(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data", buffer_size=0, buffer_timeout_s=600.0)
    with InProcessServer(config) as server:
        stub = seeded(server, "alice")
        one = [np.ones((3, 2), np.float32), np.ones(2, np.float32)]

        push(stub, "alice", SPEC, one, sequence=1, base_version=0, samples=10)
        server.call(_until_version(server, 1))
        push(stub, "alice", SPEC, one, sequence=2, base_version=1, samples=10)
        server.call(_until_version(server, 2))
        header, tensors, _ = pull(stub)

    assert header.version == 2
    for got, g in zip(tensors, INITIAL, strict=True):
        np.testing.assert_allclose(got, g + 2.0, rtol=1e-6)


def test_automatic_k_waits_for_one_update_per_recently_pushing_participant(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "data", buffer_size=0, buffer_timeout_s=600.0)
    with InProcessServer(config) as server:
        stub = seeded(server, "alice", "bob")
        a1 = [np.full((3, 2), 1.0, np.float32), np.array([1.0, 1.0], np.float32)]
        b1 = [np.full((3, 2), -4.0, np.float32), np.array([4.0, 0.0], np.float32)]
        a2 = [np.full((3, 2), 2.0, np.float32), np.array([0.0, 2.0], np.float32)]

        # Only alice has pushed so far: K = 1.
        push(stub, "alice", SPEC, a1, sequence=1, base_version=0, samples=100)
        server.call(_until_version(server, 1))
        # Now both have: K = 2, so bob's update waits for alice's next one.
        push(stub, "bob", SPEC, b1, sequence=1, base_version=1, samples=100)
        push(stub, "alice", SPEC, a2, sequence=2, base_version=1, samples=100)
        server.call(_until_version(server, 2))
        header, tensors, _ = pull(stub)

    assert header.version == 2
    for got, g, x, b, y in zip(tensors, INITIAL, a1, b1, a2, strict=True):
        np.testing.assert_allclose(got, g + x + (b + y) / 2, rtol=1e-6)


def test_automatic_k_stops_counting_a_participant_silent_past_the_window(
    tmp_path: Path,
) -> None:
    config = server_config(
        tmp_path / "data", buffer_size=0, buffer_timeout_s=600.0, active_window_s=0.2
    )
    with InProcessServer(config) as server:
        stub = seeded(server, "alice", "bob")
        one = [np.ones((3, 2), np.float32), np.ones(2, np.float32)]
        push(stub, "alice", SPEC, one, sequence=1, base_version=0, samples=10)
        server.call(_until_version(server, 1))
        time.sleep(0.5)

        push(stub, "bob", SPEC, one, sequence=1, base_version=1, samples=10)
        server.call(_until_version(server, 2))
        header, tensors, _ = pull(stub)

    # alice's push is older than the window: bob's alone made version 2.
    assert header.version == 2
    for got, g in zip(tensors, INITIAL, strict=True):
        np.testing.assert_allclose(got, g + 2.0, rtol=1e-6)


def test_stale_update_is_discounted_and_sample_claims_are_capped(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data", buffer_size=1, max_samples=500)
    with InProcessServer(config) as server:
        stub = seeded(server, "alice", "bob")
        one = [np.ones((3, 2), np.float32), np.ones(2, np.float32)]
        push(stub, "alice", SPEC, one, sequence=1, base_version=0, samples=10)
        server.call(_until_version(server, 1))
        push(stub, "alice", SPEC, one, sequence=2, base_version=1, samples=10)
        server.call(_until_version(server, 2))

        stale = push(stub, "bob", SPEC, one, sequence=1, base_version=0, samples=10_000)

    # Base 0 against current 2: staleness 2, and 10,000 claimed samples capped at 500.
    assert stale.staleness == 2
    assert stale.weight == pytest.approx(500 * (1 + 2) ** -0.5)
    assert stale.current_version == 2


def test_update_beyond_max_staleness_is_refused_with_the_current_version(tmp_path: Path) -> None:
    with InProcessServer(
        server_config(tmp_path / "data", buffer_size=1, max_staleness=1)
    ) as server:
        stub = seeded(server, "alice")
        one = [np.ones((3, 2), np.float32), np.ones(2, np.float32)]
        for sequence in (1, 2):
            push(stub, "alice", SPEC, one, sequence=sequence, base_version=sequence - 1)
            server.call(_until_version(server, sequence))

        with pytest.raises(grpc.RpcError) as refused:
            push(stub, "alice", SPEC, one, sequence=3, base_version=0)

    assert code_of(refused.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert "current version 2" in refused.value.details()


def test_spec_mismatch_is_failed_precondition_naming_the_field(server: InProcessServer) -> None:
    stub = server.stub()
    join(stub, "alice", SPEC)
    other = make_spec([(3, 3), (2,)])

    with pytest.raises(grpc.RpcError) as refused:
        join(stub, "bob", other)

    assert code_of(refused.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert "tensors[0].shape" in refused.value.details()


@pytest.mark.parametrize("where", ["tensor", "observation space"])
def test_an_empty_shape_too_large_to_lay_out_is_refused_at_join(
    server: InProcessServer, where: str
) -> None:
    # numpy sizes an empty array by its other dimensions: this one overflows it
    huge = [0, 2_305_846, 999_998_702_955]
    spec = make_spec([(3, 2), (2,)])
    if where == "tensor":
        spec.tensors[0].shape[:] = huge
    else:
        spec.observation_space.shape[:] = huge

    with pytest.raises(grpc.RpcError) as refused:
        join(server.stub(), "alice", spec)

    assert code_of(refused.value) in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    assert "999998702955" in refused.value.details()
    assert server.stub().Status(pb.StatusRequest()).sessions == []


def test_repeated_push_gets_the_first_answer_and_is_applied_once(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data", buffer_size=1)) as server:
        stub = seeded(server, "alice")
        delta = [np.ones((3, 2), np.float32), np.ones(2, np.float32)]
        first = push(stub, "alice", SPEC, delta, sequence=1, base_version=0, samples=50)
        server.call(_until_version(server, 1))

        again = push(stub, "alice", SPEC, delta, sequence=1, base_version=0, samples=50)
        _, tensors, _ = pull(stub)
        notice = stub.GetVersion(pb.GetVersionRequest(session="default"))

    assert not first.duplicate and again.duplicate
    assert (again.current_version, again.weight, again.staleness) == (
        first.current_version,
        first.weight,
        first.staleness,
    )
    assert notice.current_version == 1
    np.testing.assert_allclose(tensors[1], INITIAL[1] + 1.0)


def test_join_reports_the_last_acknowledged_sequence(server: InProcessServer) -> None:
    stub = seeded(server, "alice")
    delta = [np.zeros((3, 2), np.float32), np.zeros(2, np.float32)]
    push(stub, "alice", SPEC, delta, sequence=7, base_version=0)

    again = join(stub, "alice", SPEC)

    assert again.last_update_sequence == 7
    assert again.current_version == 0


def test_second_seed_is_already_exists(server: InProcessServer) -> None:
    stub = seeded(server, "alice", "bob")

    with pytest.raises(grpc.RpcError) as refused:
        seed(stub, "bob", SPEC, INITIAL)

    assert code_of(refused.value) == grpc.StatusCode.ALREADY_EXISTS


def test_push_before_seed_is_failed_precondition(server: InProcessServer) -> None:
    stub = server.stub()
    joined = join(stub, "alice", SPEC)

    with pytest.raises(grpc.RpcError) as refused:
        push(stub, "alice", SPEC, INITIAL, sequence=1, base_version=0)

    assert joined.current_version == -1
    assert code_of(refused.value) == grpc.StatusCode.FAILED_PRECONDITION


def test_unknown_session_is_not_found(server: InProcessServer) -> None:
    stub = server.stub()

    with pytest.raises(grpc.RpcError) as refused:
        stub.GetVersion(pb.GetVersionRequest(session="nowhere"))

    assert code_of(refused.value) == grpc.StatusCode.NOT_FOUND


def test_acting_as_another_participant_is_permission_denied(server: InProcessServer) -> None:
    stub = seeded(server, "alice", "bob")
    messages = update_messages("bob", SPEC, INITIAL, sequence=1, base_version=0)

    with pytest.raises(grpc.RpcError) as refused:
        stub.PushUpdate(iter(messages), metadata=metadata("alice"))

    assert code_of(refused.value) == grpc.StatusCode.PERMISSION_DENIED


def test_malformed_tensor_stream_is_invalid_argument_and_counted(server: InProcessServer) -> None:
    stub = seeded(server, "alice")
    messages = update_messages("alice", SPEC, INITIAL, sequence=1, base_version=0)
    messages[1].chunk.index = 5  # a gap in the chunk sequence

    with pytest.raises(grpc.RpcError) as refused:
        stub.PushUpdate(iter(messages), metadata=metadata("alice"))
    status = stub.Status(pb.StatusRequest(session="default"))

    assert code_of(refused.value) == grpc.StatusCode.INVALID_ARGUMENT
    assert status.sessions[0].participants[0].updates_rejected == 1


def test_update_of_the_wrong_shape_is_invalid_argument(server: InProcessServer) -> None:
    stub = seeded(server, "alice")
    transposed = [INITIAL[0].T, INITIAL[1]]
    messages = update_messages("alice", SPEC, transposed, sequence=1, base_version=0)

    with pytest.raises(grpc.RpcError) as refused:
        stub.PushUpdate(iter(messages), metadata=metadata("alice"))

    assert code_of(refused.value) == grpc.StatusCode.INVALID_ARGUMENT
    assert "shape" in refused.value.details()


def test_bfloat16_delta_is_accepted_and_pull_can_send_a_delta(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data", buffer_size=1)) as server:
        stub = seeded(server, "alice")
        delta = [np.full((3, 2), 0.5, np.float32), np.array([0.25, -0.75], np.float32)]
        push(stub, "alice", SPEC, delta, sequence=1, base_version=0, dtype=tpb.DTYPE_BFLOAT16)
        server.call(_until_version(server, 1))

        header, tensors, _ = pull(stub, have_version=0, dtype=tpb.DTYPE_BFLOAT16)

    assert header.is_delta and header.from_version == 0 and header.version == 1
    for got, want in zip(tensors, delta, strict=True):
        np.testing.assert_allclose(got, want)


def test_pull_of_a_version_no_longer_kept_is_not_found(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data", buffer_size=1, keep_last=1, keep_every=1000)
    with InProcessServer(config) as server:
        stub = seeded(server, "alice")
        for sequence in (1, 2):
            push(stub, "alice", SPEC, INITIAL, sequence=sequence, base_version=sequence - 1)
            server.call(_until_version(server, sequence))

        with pytest.raises(grpc.RpcError) as refused:
            pull(stub, version=1)
        header, _, _ = pull(stub, have_version=1)

    assert code_of(refused.value) == grpc.StatusCode.NOT_FOUND
    assert not header.is_delta  # version 1 is gone, so the full model comes


def test_watch_versions_sends_one_notice_now_and_one_per_new_version(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data", buffer_size=1)) as server:
        stub = seeded(server, "alice")
        watch = stub.WatchVersions(pb.GetVersionRequest(session="default"))
        first = next(watch)
        push(stub, "alice", SPEC, INITIAL, sequence=1, base_version=0)
        second = next(watch)
        watch.cancel()

    assert (first.current_version, second.current_version) == (0, 1)


def test_watch_versions_sends_a_notice_when_a_participant_joins_or_leaves(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data")) as server:
        stub = seeded(server, "alice")
        watch = stub.WatchVersions(pb.GetVersionRequest(session="default"))
        first = next(watch)
        join(stub, "bob", SPEC)
        joined = next(watch)
        stub.Leave(
            pb.LeaveRequest(session="default", participant_id="bob"), metadata=metadata("bob")
        )
        left = next(watch)
        watch.cancel()

    counts = [n.active_participants for n in (first, joined, left)]
    assert counts == [1, 2, 1]
    assert {n.current_version for n in (first, joined, left)} == {0}


def test_notices_count_the_members_pushing_weights_apart_from_those_joined(
    tmp_path: Path,
) -> None:
    # prepare: alice seeded and bob joined; neither has pushed an update
    with InProcessServer(server_config(tmp_path / "data", buffer_size=1)) as server:
        stub = seeded(server, "alice")
        join(stub, "bob", SPEC)
        watch = stub.WatchVersions(pb.GetVersionRequest(session="default"))
        before = next(watch)

        # act: alice pushes (a version: K = 1), then bob
        push(stub, "alice", SPEC, INITIAL, sequence=1, base_version=0)
        one = next(watch)
        push(stub, "bob", SPEC, INITIAL, sequence=1, base_version=1)
        two = next(watch)
        watch.cancel()

    # assert: two joined throughout; pushing counts only those heard from
    assert [n.active_participants for n in (before, one, two)] == [2, 2, 2]
    assert [n.pushing_participants for n in (before, one, two)] == [0, 1, 2]


def test_goal_is_reached_by_reported_episodes_and_can_be_raised(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data", goal_episodes=10)) as server:
        stub = seeded(server, "alice")
        before = push(stub, "alice", SPEC, INITIAL, sequence=1, base_version=0, episodes=6)
        after = push(stub, "alice", SPEC, INITIAL, sequence=2, base_version=0, episodes=6)
        raised = stub.RaiseGoal(
            pb.RaiseGoalRequest(session="default", participant_id="alice", total_episodes=20),
            metadata=metadata("alice"),
        )
        with pytest.raises(grpc.RpcError) as lowered:
            stub.RaiseGoal(pb.RaiseGoalRequest(session="default", total_episodes=5))
        rejoined = join(stub, "alice", SPEC)

    assert not before.goal.reached and after.goal.reached
    assert after.goal.episodes_done == 12
    assert not raised.reached and raised.total_episodes == 20
    assert code_of(lowered.value) == grpc.StatusCode.INVALID_ARGUMENT
    assert rejoined.goal.total_episodes == 20 and not rejoined.goal.reached


def test_unicode_participant_id_works_in_every_call(server: InProcessServer) -> None:
    stub = seeded(server, "Макар")
    reply = push(stub, "Макар", SPEC, INITIAL, sequence=1, base_version=0)
    status = stub.Status(pb.StatusRequest())

    assert not reply.duplicate
    assert [p.participant_id for p in status.sessions[0].participants] == ["Макар"]


def test_health_and_reflection_are_served(server: InProcessServer) -> None:
    with channel(server.address) as opened:
        health = health_pb2_grpc.HealthStub(opened).Check(
            health_pb2.HealthCheckRequest(service="fedrl.v1.Federation")
        )
        reflection = reflection_pb2_grpc.ServerReflectionStub(opened).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        services = {s.name for s in next(reflection).list_services_response.service}

    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert {"fedrl.v1.Federation", "grpc.health.v1.Health"} <= services


def test_pull_of_a_50m_parameter_model_streams_in_small_chunks(tmp_path: Path) -> None:
    spec = make_spec([(50, 1_000_000)])
    weights = np.arange(50_000_000, dtype=np.float32).reshape(50, 1_000_000)
    # 200 MB of float32 against a 4 MiB message limit: only chunking can carry it.
    config = server_config(tmp_path / "data", max_message_bytes=4 << 20, chunk_bytes=1 << 20)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "alice", spec)
        # Seeded in-process: the upload path is tested elsewhere, the pull is the point here.
        assert server.running is not None
        server.call(
            server.running.federation.seed("default", "alice", spec_hash(spec), [("t0", weights)])
        )

        header, tensors, sizes = pull(stub, codec=tpb.CODEC_NONE)

    assert header.version == 0
    assert len(sizes) == 1 + -(-weights.nbytes // (1 << 20))  # the header, then 1 MiB pieces
    assert max(sizes) < 2 << 20
    np.testing.assert_array_equal(tensors[0], weights)


async def _until_version(server: InProcessServer, version: int) -> None:
    """Wait (on the server's loop) until the default session reaches `version`."""
    assert server.running is not None
    session = server.running.federation.session("default")
    while session.aggregator.current_version < version:
        await asyncio.wait_for(session.changed.wait(), timeout=30)


def test_version_calls_naming_another_participant_are_permission_denied(
    server: InProcessServer,
) -> None:
    stub = seeded(server, "alice", "bob")
    request = pb.GetVersionRequest(session="default", participant_id="bob")

    with pytest.raises(grpc.RpcError) as once:
        stub.GetVersion(request, metadata=metadata("alice"), timeout=30)
    with pytest.raises(grpc.RpcError) as watched:
        next(iter(stub.WatchVersions(request, metadata=metadata("alice"), timeout=30)))
    own = stub.GetVersion(
        pb.GetVersionRequest(session="default", participant_id="alice"),
        metadata=metadata("alice"),
        timeout=30,
    )

    assert once.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert watched.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert own.current_version == 0


def test_a_pulled_version_names_the_callers_latest_update_it_includes(
    server: InProcessServer,
) -> None:
    # prepare: alice's update 1 and bob's update 1 make version 1 (K = 2); alice's
    # update 2 waits in the buffer for a partner.
    stub = seeded(server, "alice", "bob")
    step = [np.ones((3, 2), np.float32), np.zeros(2, np.float32)]
    push(stub, "alice", SPEC, step, sequence=1, base_version=0)
    push(stub, "bob", SPEC, step, sequence=1, base_version=0)
    server.call(_until_version(server, 1))
    push(stub, "alice", SPEC, step, sequence=2, base_version=1)

    # act
    alice_newest, _, _ = pull(stub, participant_id="alice")
    alice_base, _, _ = pull(stub, participant_id="alice", version=0)
    bob_newest, _, _ = pull(stub, participant_id="bob")
    anonymous, _, _ = pull(stub)

    # assert
    assert alice_newest.version == 1 and alice_newest.applied_sequence == 1
    assert alice_base.applied_sequence == 0
    assert bob_newest.applied_sequence == 1
    assert anonymous.applied_sequence == 0


def test_a_score_of_any_version_is_credited_to_that_version(server: InProcessServer) -> None:
    # prepare: versions 1 and 2; alice, already on version 2, reports a score of version 1
    stub = seeded(server, "alice", "bob")
    step = [np.ones((3, 2), np.float32), np.zeros(2, np.float32)]
    for sequence, base in ((1, 0), (2, 1)):
        push(stub, "alice", SPEC, step, sequence=sequence, base_version=base)
        push(stub, "bob", SPEC, step, sequence=sequence, base_version=base)
        server.call(_until_version(server, sequence))

    # act
    push(
        stub, "alice", SPEC, step, sequence=3, base_version=2,
        metrics=pb.UpdateMetrics(base_eval_return=321.0, evaluated_version=1),
    )  # fmt: skip
    status = stub.Status(pb.StatusRequest(session="default", max_versions=10)).sessions[0]

    # assert
    scores = {v.version: v.eval_return for v in status.versions if v.HasField("eval_return")}
    assert scores == {1: 321.0}
    assert status.best_version == 1 and status.best_eval_return == 321.0


def test_a_score_naming_no_possible_version_is_refused(server: InProcessServer) -> None:
    stub = seeded(server, "alice")
    messages = update_messages(
        "alice", SPEC, [np.ones((3, 2), np.float32), np.zeros(2, np.float32)],
        sequence=1, base_version=0,
        metrics=pb.UpdateMetrics(base_eval_return=1.0, evaluated_version=2**62),
    )  # fmt: skip

    with pytest.raises(grpc.RpcError) as refused:
        stub.PushUpdate(iter(messages), metadata=metadata("alice"), timeout=60)

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "evaluated_version" in str(refused.value.details())
