"""What a participant trains on reaches the server's status, its table and the dashboard.

A trading run on synthetic bars must be told apart from one on market prices wherever the
session is shown: the Join carries the label, the state database keeps it across restarts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from fedrl.client.federation.federation_client import DataLabel, FederationClient
from fedrl.common.status_table import render_status
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.dashboard.status_json import status_document
from tests.support.server_harness import (
    InProcessServer,
    join,
    make_spec,
    metadata,
    server_config,
)

SPEC = make_spec([(4,)])
FALLBACK = DataLabel(
    "SYNTHETIC synthetic GBM market (fallback: postgresql://trader@db/market: cannot reach "
    "the server)",
    synthetic=True,
)
REAL = DataLabel("postgresql://trader@db/market (table historical_bars)", synthetic=False)


def join_as(address: str, participant_id: str, data: DataLabel) -> None:
    async def body() -> None:
        async with grpc.aio.insecure_channel(address) as chan:
            client = FederationClient(chan, participant_id=participant_id, session="default")
            await client.join(SPEC, data=data)

    asyncio.run(body())


def participants(server: InProcessServer) -> dict[str, pb.ParticipantState]:
    reply = server.stub().Status(pb.StatusRequest())
    return {p.participant_id: p for p in reply.sessions[0].participants}


def test_the_label_of_each_join_shows_in_status_table_and_dashboard(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data")
    with InProcessServer(config) as server:
        join_as(server.address, "Макар", FALLBACK)
        join_as(server.address, "alice", REAL)
        join(server.stub(), "bob", SPEC)

        states = participants(server)
        reply = server.stub().Status(pb.StatusRequest())

    assert (states["Макар"].data_source, states["Макар"].synthetic_data) == (
        FALLBACK.source,
        True,
    )
    assert (states["alice"].data_source, states["alice"].synthetic_data) == (REAL.source, False)
    assert (states["bob"].data_source, states["bob"].synthetic_data) == ("", False)
    table = render_status(reply)
    (makar,) = [line for line in table.splitlines() if line.startswith("Макар")]
    assert "SYNTHETIC: SYNTHETIC synthetic GBM market" in makar
    (alice,) = [line for line in table.splitlines() if line.startswith("alice")]
    assert "SYNTHETIC" not in alice and REAL.source in alice
    shown = {p["participant_id"]: p for p in status_document(reply)["sessions"][0]["participants"]}
    assert shown["Макар"]["synthetic_data"] is True
    assert shown["alice"]["data_source"] == REAL.source


def test_the_label_survives_a_restart_and_follows_the_latest_join(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data")
    with InProcessServer(config) as server:
        join_as(server.address, "Макар", FALLBACK)
    with InProcessServer(config) as server:
        kept = participants(server)["Макар"]
        join_as(server.address, "Макар", REAL)
        latest = participants(server)["Макар"]

    assert kept.synthetic_data and kept.data_source == FALLBACK.source
    assert not latest.synthetic_data and latest.data_source == REAL.source


def test_an_overlong_data_source_is_refused(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "data")) as server:
        stub = server.stub()
        with pytest.raises(grpc.RpcError) as caught:
            stub.Join(
                pb.JoinRequest(
                    session="default",
                    participant_id="eve",
                    spec=SPEC,
                    data_source="x" * 5_000,
                ),
                metadata=metadata("eve"),
            )

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "data_source has 5000 characters" in str(caught.value.details())
