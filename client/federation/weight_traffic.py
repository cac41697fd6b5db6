"""Weight sync's network-thread half: sends released updates, pulls the versions it hears of.

The main thread's half (fedrl.client.federation.weight_sync) writes updates
to the outbox and releases them by sequence once the sync state records
them; this half sends what is released, in order, and pulls each newer
global version the link hears of into a slot the main thread adopts from.
An update refused as too stale is handed back through the outbox, one
refused for good is kept in its rejected/ folder.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc

from fedrl.client.federation.errors import AlreadySeededError, RejectedError
from fedrl.client.federation.federation_client import FederationClient, GlobalModel
from fedrl.client.federation.outbox import Outbox
from fedrl.client.federation.server_link import ServerLink
from fedrl.client.federation.sync_state import NamedArrays
from fedrl.client.federation.update_entries import UPDATE, update_messages
from fedrl.proto.v1 import federation_pb2 as pb

log = logging.getLogger(__name__)


class WeightTraffic:
    """The network thread's half: sends released updates, pulls versions the link hears of."""

    def __init__(self, link: ServerLink, outbox: Outbox, *, seed_weights: NamedArrays) -> None:
        self._link = link
        self._outbox = outbox
        self._seed_weights = seed_weights
        # Network thread only.
        self._held: GlobalModel | None = None
        self._rejoined_for: int | None = None
        # Shared with the main thread, under _lock.
        self._lock = threading.Lock()
        self._sendable_through = 0
        self._pending: GlobalModel | None = None
        self._given_back = 0
        self._wake = link.add_task("weight sync", self._work, on_join=self._joined, on_notice=True)

    # Main-thread side.

    def release(self, sequence: int) -> None:
        """Updates up to `sequence` are recorded in the sync state: they may go out."""
        with self._lock:
            self._sendable_through = max(self._sendable_through, sequence)
        self._wake()

    def take_pending(self) -> GlobalModel | None:
        """The newest pulled global model not adopted yet, if any."""
        with self._lock:
            model, self._pending = self._pending, None
            return model

    @property
    def given_back(self) -> int:
        """How many updates were handed back so far (the main thread takes them back)."""
        with self._lock:
            return self._given_back

    def wait_for_any_version(self, timeout_s: float) -> bool:
        """Wait until a pulled version waits for adoption; False if none came in time."""

        def pulled() -> bool:
            with self._lock:
                return self._pending is not None

        return self._link.wait_until(pulled, wake=self._wake, timeout_s=timeout_s)

    def wait_for_version(self, sequence: int, timeout_s: float) -> bool:
        """Wait until a pulled version holds update `sequence`; False if none did in time.

        A handed-back update ends the wait at once: no version will hold it.
        """
        given_back = self.given_back

        def held() -> bool:
            with self._lock:
                model = self._pending
            return model is not None and model.applied_sequence >= sequence

        def settled() -> bool:
            return held() or self.given_back != given_back

        return self._link.wait_until(settled, wake=self._wake, timeout_s=timeout_s) and held()

    def refresh_now(self, timeout_s: float) -> None:
        """Ask for the newest global version and pull it now (for take_pending)."""
        self._link.call(asyncio.wait_for(self._refresh(), timeout_s), timeout_s + 5)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every released update is acknowledged; False if time ran out."""
        return self._link.wait_until(self._all_sent, wake=self._wake, timeout_s=timeout_s)

    # Network-thread side.

    async def _joined(self, client: FederationClient, reply: pb.JoinReply) -> None:
        """After every join: lift the outbox past what the server holds; seed an empty session."""
        self._outbox.observe_acknowledged(UPDATE, reply.last_update_sequence)
        if reply.current_version >= 0:
            return
        try:
            version = await client.seed_model(self._seed_weights)
            log.info("seeded session %r with this participant's model", client.session)
        except AlreadySeededError:
            version = (await client.get_version()).current_version
        self._link.update_view(version=version)

    async def _work(self) -> None:
        await self._send_released()
        await self._pull_newer()

    async def _send_released(self) -> None:
        client = self._link.client
        outbox = self._outbox
        while True:
            pending = outbox.pending(UPDATE)
            with self._lock:
                through = self._sendable_through
            if not pending or pending[0].merged_through > through:
                return
            entry = outbox.next_to_send(UPDATE, through=through)
            assert entry is not None
            try:
                reply = await client.push_update(update_messages(entry))
            except RejectedError as exc:
                if (
                    exc.code == grpc.StatusCode.FAILED_PRECONDITION
                    and self._rejoined_for != entry.sequence
                ):
                    # The server may have forgotten us (a restored backup):
                    # join again and retry once before giving the update up.
                    self._rejoined_for = entry.sequence
                    await self._link.join()
                    continue
                if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
                    # Refused as it stands (too stale): its progress goes into
                    # the next update, which is based on a newer version.
                    outbox.give_back(UPDATE, entry.sequence, str(exc))
                    with self._lock:
                        self._given_back += 1
                else:
                    outbox.reject(UPDATE, entry.sequence, str(exc))
                continue
            outbox.acknowledge(UPDATE, entry.sequence)
            if reply.duplicate:
                log.info(
                    "update %d had been acknowledged before the restart; the server kept "
                    "its first answer",
                    entry.sequence,
                )
            # Only this task counts acknowledgements, so reading and writing
            # them in two steps loses none.
            view = self._link.view
            self._link.update_view(
                goal=reply.goal,
                acknowledged=view.acknowledged + 1,
                duplicates=view.duplicates + int(reply.duplicate),
            )

    async def _pull_newer(self) -> None:
        """Pull the newest global version if the link heard of one newer than the one held."""
        held = self._held.version if self._held is not None else -1
        if self._link.view.version <= held:
            return
        model = await self._link.client.pull_model(have=self._held)
        self._held = model
        with self._lock:
            self._pending = model

    async def _refresh(self) -> None:
        notice = await self._link.client.get_version()
        self._link.update_view(
            version=notice.current_version,
            goal=notice.goal,
            active_participants=notice.active_participants,
        )
        await self._pull_newer()

    def _all_sent(self) -> bool:
        with self._lock:
            through = self._sendable_through
        return not any(e.sequence <= through for e in self._outbox.pending(UPDATE))
