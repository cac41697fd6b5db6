"""Ratings of two-player games on the server: reported, shown, durable, and checked."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrl.common.status_table import render_status
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.dashboard.status_json import status_document
from fedrl.server.federation.ratings import MAX_PER_PARTICIPANT, checked
from fedrl.server.refusals import InvalidRequestError
from tests.support.server_harness import (
    InProcessServer,
    ServerProcess,
    join,
    make_spec,
    metadata,
    seed,
    server_config,
)

SPEC = make_spec([(4,)], env_id="pettingzoo/tictactoe_v3")


def report(stub: pb_grpc.FederationStub, pid: str, *ratings: pb.PlayerRating) -> pb.RatingsReply:
    return stub.ReportRatings(  # type: ignore[no-any-return]
        pb.RatingsReport(session="default", participant_id=pid, ratings=list(ratings)),
        metadata=metadata(pid),
    )


def version(v: int, rating: float, games: int) -> pb.PlayerRating:
    return pb.PlayerRating(
        kind="version", name=f"version {v}", version=v, rating=rating, games=games
    )


def player(kind: str, name: str, rating: float, games: int = 1) -> pb.PlayerRating:
    return pb.PlayerRating(kind=kind, name=name, version=-1, rating=rating, games=games)


def test_status_shows_each_raters_ratings_and_a_versions_games_weighted_rating(
    tmp_path: Path,
) -> None:
    with InProcessServer(server_config(tmp_path)) as server:
        stub = server.stub()
        for pid in ("Макар", "bob"):
            join(stub, pid, SPEC)
        seed(stub, "Макар", SPEC, [np.zeros(4)])
        report(stub, "Макар", version(0, 300.0, 30), player("latest", "latest", 410.0, 90))
        stored = report(stub, "bob", version(0, 200.0, 10), player("snapshot", "snapshot 40", 50.0))
        assert stored.stored == 2

        state = stub.Status(pb.StatusRequest(session="default")).sessions[0]

    (v0,) = state.versions
    assert v0.rating == pytest.approx((300.0 * 30 + 200.0 * 10) / 40) and v0.rated_games == 40
    rows = {(r.participant_id, r.name): r for r in state.ratings}
    assert rows["Макар", "latest"].rating == 410.0 and rows["Макар", "latest"].games == 90
    assert rows["bob", "snapshot 40"].kind == "snapshot"
    text = render_status(pb.StatusReply(sessions=[state]))
    assert "ratings (Elo" in text and "snapshot 40" in text and "275" in text
    document = status_document(pb.StatusReply(sessions=[state]))["sessions"][0]
    assert document["versions"][0]["rating"] == pytest.approx(275.0)
    assert {r["name"] for r in document["ratings"]} == {"version 0", "latest", "snapshot 40"}


def test_a_newer_report_replaces_the_older_rating_of_a_player(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path)) as server:
        stub = server.stub()
        join(stub, "ann", SPEC)
        report(stub, "ann", player("latest", "latest", 100.0))
        report(stub, "ann", player("latest", "latest", 150.0, 7))
        state = stub.Status(pb.StatusRequest(session="default")).sessions[0]
    assert [(r.name, r.rating, r.games) for r in state.ratings] == [("latest", 150.0, 7)]


def test_ratings_survive_a_restart_of_the_server(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as server:
        stub = server.stub()
        join(stub, "ann", SPEC)
        seed(stub, "ann", SPEC, [np.zeros(4)])
        report(stub, "ann", version(0, 321.0, 12))
        server.kill()
        server.start()
        state = server.stub().Status(pb.StatusRequest(session="default")).sessions[0]
    assert state.versions[0].rating == 321.0
    assert [r.name for r in state.ratings] == ["version 0"]


def test_bad_reports_are_refused_and_store_nothing(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path)) as server:
        stub = server.stub()
        join(stub, "ann", SPEC)
        bad = [
            player("champion", "x", 1.0),
            player("latest", "", 1.0),
            player("latest", "x" * 65, 1.0),
            player("latest", "x", float("nan")),
            player("latest", "x", 2e6),
            pb.PlayerRating(kind="version", name="v", version=-1, rating=1.0),
            pb.PlayerRating(kind="snapshot", name="s", version=3, rating=1.0),
        ]
        for rating in bad:
            with pytest.raises(grpc.RpcError) as refused:
                report(stub, "ann", player("latest", "ok", 1.0), rating)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as stranger:
            report(stub, "eve", player("latest", "latest", 1.0))
        assert stranger.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as impostor:
            stub.ReportRatings(
                pb.RatingsReport(session="default", participant_id="ann"),
                metadata=metadata("eve"),
            )
        assert impostor.value.code() == grpc.StatusCode.PERMISSION_DENIED
        state = stub.Status(pb.StatusRequest(session="default")).sessions[0]
    assert not state.ratings


def test_each_participant_keeps_a_bounded_number_of_rows(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path)) as server:
        stub = server.stub()
        join(stub, "ann", SPEC)
        for batch in range(3):
            report(
                stub,
                "ann",
                *(player("snapshot", f"snapshot {batch}-{i}", 1.0) for i in range(1000)),
            )
        state = stub.Status(pb.StatusRequest(session="default")).sessions[0]
    assert len(state.ratings) == MAX_PER_PARTICIPANT
    assert {r.name for r in state.ratings} >= {f"snapshot 2-{i}" for i in range(1000)}


@settings(max_examples=200, deadline=None)
@given(
    kind=st.text(max_size=10),
    name=st.text(max_size=80),
    version=st.integers(-(2**63), 2**63 - 1),
    rating=st.floats(allow_nan=True, allow_infinity=True),
    games=st.integers(0, 2**64 - 1),
)
def test_the_report_check_refuses_or_accepts_any_rating_cleanly(
    kind: str, name: str, version: int, rating: float, games: int
) -> None:
    item = pb.PlayerRating(kind=kind, name=name, version=version, rating=rating, games=games)
    try:
        (accepted,) = checked([item])
    except InvalidRequestError:
        return
    assert accepted.kind in {"latest", "baseline", "snapshot", "version"}
    assert 1 <= len(accepted.name) <= 64 and np.isfinite(accepted.rating)
    assert accepted.games < 2**63 and (accepted.version >= 0) == (accepted.kind == "version")
