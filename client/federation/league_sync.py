"""Two-player games in a session: the session's version history joins the league; ratings go up.

The server keeps every global version durable, which makes the session's
history a league of opponents no one participant could build alone. This
part of the sync loop, for an engine with self-play
(fedrl.client.training.self_play), does two things:

- at every join it asks the server which versions it still keeps (Status:
  those with a checkpoint) and pulls `league_versions` of them by number
  (PullModel with that version), spread evenly over the history with the
  newest always among them, skipping those the league already holds (the
  league is saved with the participant's progress: a restart pulls none of
  them again). The main thread adds what arrived to the league at its next
  round (`after_poll`); versions adopted while training join there too
  (fedrl.client.federation.weight_sync);
- every REPORT_INTERVAL_S, and at the end, it reports its ratings (its
  learner, its snapshots, the global versions it played, the fixed players)
  with ReportRatings, which Status, the dashboard and `--episodes 0` show.

The network traffic runs as a task of the link (fedrl.client.federation.server_link);
the main thread and the task meet only in two lists under a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import grpc

from fedrl.client.federation.errors import RejectedError
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.server_link import ServerLink
from fedrl.client.federation.sync_state import NamedArrays
from fedrl.client.training.league import Rating
from fedrl.client.training.self_play import SelfPlay
from fedrl.proto.v1 import federation_pb2 as pb

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 10.0
"""Seconds between rating reports: the dashboard refreshes every second or so, and a rating
moves by a few points per game at most."""
HISTORY_LISTED = 1_000
"""Versions Status is asked to list when the history is read: the newest thousand, among which
lie the ones the server still keeps (its newest, its best and every M-th)."""


def spread(versions: Sequence[int], count: int) -> list[int]:
    """`count` of `versions` (sorted) spread evenly from the oldest to the newest, which is
    always among them; all of them if there are no more than `count`."""
    ordered = sorted(set(versions))
    if count <= 0 or not ordered:
        return []
    if len(ordered) <= count:
        return ordered
    if count == 1:
        return [ordered[-1]]
    step = (len(ordered) - 1) / (count - 1)
    return sorted({ordered[round(i * step)] for i in range(count)})


def as_player_ratings(ratings: Sequence[Rating]) -> list[pb.PlayerRating]:
    return [
        pb.PlayerRating(kind=r.kind, name=r.name, version=r.version, rating=r.rating, games=r.games)
        for r in ratings
    ]


class LeagueSync:
    """Pulls the session's kept versions into the league and reports the league's ratings."""

    def __init__(self, self_play: SelfPlay, link: ServerLink) -> None:
        self._self_play = self_play
        self._link = link
        self._versions = self_play.config.league_versions
        self._reported_at = time.monotonic()
        # Shared with the network thread, under _lock.
        self._lock = threading.Lock()
        self._history_due = False
        self._held: set[int] = set(self_play.league.versions())
        self._arrived: list[tuple[int, NamedArrays]] = []
        self._ratings: list[pb.PlayerRating] | None = None
        self._wake = link.add_task("league sync", self._work, on_join=self._joined)

    # Main-thread side.

    def after_poll(self) -> None:
        """Add the versions that arrived to the league; hand over the ratings when due."""
        with self._lock:
            arrived, self._arrived = self._arrived, []
        for version, tensors in arrived:
            self._self_play.add_version(version, tensors)
        if time.monotonic() - self._reported_at >= REPORT_INTERVAL_S:
            self.report()

    def report(self) -> None:
        """Send the league's ratings now (on the network thread)."""
        self._reported_at = time.monotonic()
        with self._lock:
            self._ratings = as_player_ratings(self._self_play.ratings())
        self._wake()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the last ratings handed over are sent; False if time ran out."""
        return self._link.wait_until(
            lambda: self._ratings is None, wake=self._wake, timeout_s=timeout_s
        )

    # Network-thread side.

    async def _joined(self, client: FederationClient, reply: pb.JoinReply) -> None:
        with self._lock:
            self._history_due = self._versions > 0

    async def _work(self) -> None:
        client = self._link.client
        with self._lock:
            history_due, ratings = self._history_due, self._ratings
        if history_due:
            await self._pull_history(client)
            with self._lock:
                self._history_due = False
        if ratings is not None:
            await client.report_ratings(ratings)
            with self._lock:
                if self._ratings is ratings:
                    self._ratings = None

    async def _pull_history(self, client: FederationClient) -> None:
        reply = await client.status(max_versions=HISTORY_LISTED)
        kept = [v.version for session in reply.sessions for v in session.versions if v.checkpoint]
        with self._lock:
            wanted = [v for v in spread(kept, self._versions) if v not in self._held]
        for version in wanted:
            try:
                model = await client.pull_model(version=version)
            except RejectedError as exc:
                if exc.code != grpc.StatusCode.NOT_FOUND:
                    raise
                # Pruned between the listing and the pull: the others will do.
                log.info("global version %d is no longer kept; skipped", version)
                continue
            with self._lock:
                self._held.add(version)
                self._arrived.append((model.version, model.tensors))
