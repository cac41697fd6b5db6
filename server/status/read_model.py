"""The status read model: one StatusReply from every part's tables, for everyone who shows it.

Above the features: it joins the federation's sessions, participants and
versions (storage/state_db.py) with the population's members and lineage
(population/records.py), each participant's experience counts
(experience/store.py) and two-player games' ratings (federation/ratings.py),
so storage never imports the parts that keep tables
in it. The Status RPC, global_state.json, the dashboard and `fedrl-server
status` all read this one view, so they cannot disagree.
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable

from fedrl.common.group_rules_serde import rules_to_proto
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.experience.store import participant_counts
from fedrl.server.federation import ratings
from fedrl.server.federation.federation import Federation
from fedrl.server.federation.session import goal_state
from fedrl.server.names import now_ms
from fedrl.server.population.records import describe as describe_population
from fedrl.server.storage.state_db import SessionRow, StateDB

StatusSource = Callable[[str, int], Awaitable[pb.StatusReply]]
"""What the Status RPC and the dashboard call: (session, max versions) -> the reply."""


class StatusView:
    """Reads the status of one state database; use it from the thread that uses the database."""

    def __init__(self, db: StateDB, *, strategy_for: Callable[[str], str] | None = None) -> None:
        """`strategy_for` names each session's strategy (the database keeps the server's one)."""
        self._db = db
        self._strategy_for = strategy_for
        self._env_steps: dict[str, tuple[list[int], list[int]]] = {}
        """Per session: committed versions that folded in acks, and the running sum of their
        env steps (see _env_steps_by_version)."""

    def read(self, session: str | None, max_versions: int, now_ms: int) -> pb.StatusReply:
        """Every session's state (or only `session`'s), each with its newest versions."""
        reply = pb.StatusReply(server_time_unix_ms=now_ms)
        config = self._db.session_config()
        for row in self._db.sessions():
            if session and row.name != session:
                continue
            state = self._session_state(row, max_versions, config)
            if self._strategy_for is not None:
                # The database keeps one server-wide config; each session shows its strategy.
                state.config.strategy = self._strategy_for(row.name)
            reply.sessions.append(state)
        return reply

    def _session_state(
        self, row: SessionRow, max_versions: int, config: pb.SessionConfig
    ) -> pb.SessionState:
        latest = self._db.latest_version(row.name)
        state = pb.SessionState(
            session=row.name,
            spec_hash=row.spec_hash,
            env_id=row.spec.env_id,
            goal=goal_state(row.goal_total, row.episodes_done),
            env_steps=row.env_steps,
            current_version=latest.version if latest else -1,
            best_version=-1,
            config=config,
            updates_quarantined=self._db.quarantined_count(row.name),
            mode="pbt" if row.population else "federated",
        )
        # Each session shows its own rules; the database's config holds the server's settings.
        rules = row.group_rules
        state.config.rules.CopyFrom(rules_to_proto(rules))
        state.config.sync_interval = rules.sync_interval
        if row.population:
            describe_population(self._db.connection, row.name, state)
        best = self._db.best_version(row.name)
        if best is not None:
            state.best_version, state.best_eval_return = best
        participants = self._db.connection.execute(
            "SELECT participant_id, first_seen_ms, last_seen_ms, status, episodes, env_steps, "
            "updates_accepted, updates_rejected, updates_duplicate, best_eval_return "
            "FROM participants WHERE session=? ORDER BY first_seen_ms, participant_id",
            (row.name,),
        ).fetchall()
        experience = participant_counts(self._db.connection, row.name)
        data = {
            pid: (source, bool(synthetic))
            for pid, source, synthetic in self._db.connection.execute(
                "SELECT participant_id, source, synthetic FROM participant_data WHERE session=?",
                (row.name,),
            )
        }
        for pid, first, last, status, eps, steps, acc, rej, dup, best_eval in participants:
            batches, rejected = experience.get(pid, (0, 0))
            source, synthetic = data.get(pid, ("", False))
            item = state.participants.add(
                participant_id=pid,
                first_seen_unix_ms=first,
                last_seen_unix_ms=last,
                status=status,
                episodes=eps,
                env_steps=steps,
                updates_accepted=acc,
                updates_rejected=rej,
                updates_duplicate=dup,
                experience_batches=batches,
                experience_rejected=rejected,
                data_source=source,
                synthetic_data=synthetic,
            )
            if best_eval is not None:
                item.best_eval_return = best_eval
            state.active_participants += status == "active"
        evals = dict(
            self._db.connection.execute(
                "SELECT version, eval_sum / eval_count FROM versions "
                "WHERE session=? AND eval_count > 0",
                (row.name,),
            ).fetchall()
        )
        env_steps = self._env_steps_by_version(row.name)
        rated = ratings.version_ratings(self._db.connection, row.name)
        ratings.describe(self._db.connection, row.name, state)
        for version in self._db.version_rows(row.name, limit=max_versions):
            listed = state.versions.add(
                version=version.version,
                parent=version.parent,
                created_unix_ms=version.created_ms,
                contributors=list(version.contributors),
                max_staleness=version.max_staleness,
                checkpoint=version.checkpoint,
                env_steps=env_steps(version.version),
            )
            if version.mean_return is not None:
                listed.mean_return = version.mean_return
            if version.version in evals:
                listed.eval_return = evals[version.version]
            if version.version in rated:
                listed.rating, listed.rated_games = rated[version.version]
            if version.version == state.best_version:
                state.best_checkpoint = version.checkpoint
        if state.best_version >= 0 and not state.best_checkpoint:
            found = self._db.connection.execute(
                "SELECT checkpoint FROM versions WHERE session=? AND version=?",
                (row.name, state.best_version),
            ).fetchone()
            state.best_checkpoint = found[0] if found else ""
        return state

    def _env_steps_by_version(self, session: str) -> Callable[[int], int]:
        """Env steps folded into each version and its ancestors, as a lookup by version.

        Versions form one chain (each is its parent plus the updates folded
        into it), so the sum over acks applied at or below a version is what
        the global model had learned from at that version. A version's acks
        are marked in the transaction that commits it and never change after,
        so the running sums are kept and each call reads only the acks of
        versions committed since the last one (the status view is read every
        second; summing a long session's every ack each time would not be free).
        """
        versions, totals = self._env_steps.setdefault(session, ([], []))
        rows = self._db.connection.execute(
            "SELECT applied_version, SUM(env_steps) FROM acks "
            "WHERE session=? AND applied_version > ? "
            "GROUP BY applied_version ORDER BY applied_version",
            (session, versions[-1] if versions else -1),
        ).fetchall()
        for version, steps in rows:
            versions.append(int(version))
            totals.append((totals[-1] if totals else 0) + int(steps))

        def lookup(version: int) -> int:
            at = bisect.bisect_right(versions, version)
            return totals[at - 1] if at else 0

        return lookup


class ServerStatus:
    """The status of a running server's sessions, read on its database thread."""

    def __init__(self, federation: Federation) -> None:
        self._federation = federation
        config = federation.config
        self._view = StatusView(federation.db.db, strategy_for=config.strategy_for)
        self._default_versions = config.status_versions

    async def read(self, session_name: str, max_versions: int) -> pb.StatusReply:
        """One session's status ('' for all); NotFoundError for a session the server lacks."""
        name = self._federation.session(session_name).name if session_name else None
        limit = max_versions or self._default_versions
        now = now_ms()
        return await self._federation.db(lambda _: self._view.read(name, limit, now))
