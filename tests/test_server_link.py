"""The server link hears of new versions over WatchVersions and reopens a broken stream."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedrl.client.federation.backoff import BackoffPolicy
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.server_link import ServerLink
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.ports import free_port
from tests.support.server_harness import (
    CHANNEL_OPTIONS,
    InProcessServer,
    join,
    make_spec,
    push,
    seed,
    server_config,
)

SPEC = make_spec([(3, 2), (2,)])
INITIAL = [np.zeros((3, 2), np.float32), np.zeros(2, np.float32)]
DELTA = [np.full((3, 2), 0.5, np.float32), np.ones(2, np.float32)]
WAIT_S = 60.0


class Heard:
    """What a task woken by the session's notices saw of the link's view, in order."""

    def __init__(self, link: ServerLink) -> None:
        self._link = link
        self.views: list[tuple[bool, int]] = []
        self._changed = threading.Condition()

    async def record(self) -> None:
        view = self._link.view
        with self._changed:
            self.views.append((view.connected, view.version))
            self._changed.notify_all()

    def wait_for(self, condition: Callable[[list[tuple[bool, int]]], bool], what: str) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: condition(self.views), WAIT_S), (
                f"never heard {what}; heard {self.views}"
            )


@contextmanager
def linked(address: str, participant_id: str) -> Iterator[tuple[ServerLink, Heard]]:
    """A started link for `participant_id` with one task that records every notice."""
    link = ServerLink(
        channel_factory=lambda: grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS),
        participant_id=participant_id,
        session="default",
        spec=SPEC,
        backoff=BackoffPolicy(base_s=0.1, cap_s=0.5),
    )
    heard = Heard(link)
    link.add_task("recording", heard.record, on_notice=True)
    try:
        link.start()
        link.connect()
        link.run_in_background()
        yield link, heard
    finally:
        link.close()


def test_a_version_made_from_another_participants_push_is_noticed_without_asking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    async def get_version(self: FederationClient) -> pb.VersionNotice:
        asked.append(self.participant_id)
        raise AssertionError("the link asked for the version instead of watching it")

    monkeypatch.setattr(FederationClient, "get_version", get_version)
    with InProcessServer(server_config(tmp_path / "server", buffer_size=1)) as server:
        stub = server.stub()
        join(stub, "bob", SPEC)
        seed(stub, "bob", SPEC, INITIAL)
        with linked(server.address, "Макар") as (link, heard):
            heard.wait_for(lambda views: (True, 0) in views, "version 0")

            push(stub, "bob", SPEC, DELTA, sequence=1, base_version=0)

            heard.wait_for(lambda views: (True, 1) in views, "version 1")
            view = link.view

    assert asked == []
    assert (view.version, view.active_participants) == (1, 2)
    versions = [version for _, version in heard.views]
    assert versions == sorted(versions)


def test_after_a_server_restart_the_link_joins_again_and_hears_the_next_version(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "server", port=free_port(), buffer_size=1)
    server = InProcessServer(config).start()
    try:
        stub = server.stub()
        join(stub, "bob", SPEC)
        seed(stub, "bob", SPEC, INITIAL)
        with linked(server.address, "Макар") as (link, heard):
            heard.wait_for(lambda views: (True, 0) in views, "version 0")

            server.stop()
            restarted_ms = time.time() * 1000
            server = InProcessServer(config).start()
            stub = server.stub()
            join(stub, "bob", SPEC)
            push(stub, "bob", SPEC, DELTA, sequence=1, base_version=0)

            heard.wait_for(lambda views: (True, 1) in views, "version 1 after the restart")
            status = stub.Status(pb.StatusRequest(session="default"))
    finally:
        server.stop()

    seen = {p.participant_id: p.last_seen_unix_ms for p in status.sessions[0].participants}
    # Only a Join touches the participant's row: it joined the restarted server anew.
    assert seen["Макар"] >= restarted_ms
    assert link.fatal is None
