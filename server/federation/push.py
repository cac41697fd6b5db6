"""The push pipeline: a new update is checked, made durable, acknowledged, then buffered.

A push is acknowledged in this order: checks (session, spec, sequence,
staleness, tensors) -> update log append (durable) -> ack row with the answer
and the counters (durable) -> queued for the aggregator -> answer. A crash
between the log and the ack row is repaired at start: every logged update
past the newest version gets its ack row (INSERT OR IGNORE, still_pending)
and goes back into the buffer, so the client's retry meets a stored answer.
A repeated push, or its twin still on its way, gets the first answer.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.federation.aggregator import NamedTensors
from fedrl.server.federation.checks import check_tensors
from fedrl.server.federation.session import PushRequest, PushResult, Session, goal_state
from fedrl.server.names import now_ms
from fedrl.server.refusals import PreconditionError, RequestRefusedError
from fedrl.server.storage.db_runner import AckBatcher, DbRunner
from fedrl.server.storage.state_db import AckRow
from fedrl.server.storage.update_record import LoggedUpdate
from fedrl.server.strategy.aggregate import l2_norm


class Pushes:
    """Takes the pushes of every session of one server, in the order above."""

    def __init__(self, db: DbRunner, *, max_pending: int) -> None:
        """`max_pending`: acknowledged updates not yet in a version past which pushes wait."""
        self._max_pending = max_pending
        self._db = db
        self._acks = AckBatcher(db)

    async def check(self, session: Session, pid: str, request: PushRequest) -> PushResult | None:
        """The stored answer for a repeated push, None for a new one; raises if it is refused.

        `pid` is a member of `session` (the caller checked).
        """
        session.check_hash(request.spec_hash)
        session.refuse_in_population("push weight deltas")
        # Its numbers were range-checked when it was made (PushRequest.__post_init__).
        pending = session.in_flight.get((pid, request.sequence))
        if pending is not None:
            # A twin still on its way: its answer, counted like any repeated push.
            answer = _as_duplicate(await asyncio.shield(pending))
            await self._count_duplicate(session, pid)
            return answer
        if request.sequence <= session.last_sequences.get(pid, 0):
            return await self._stored_answer(session, pid, request.sequence)
        if session.aggregator.current_version < 0:
            raise PreconditionError(
                f"session {session.name!r} has no model yet: call SeedModel first"
            )
        try:
            session.strategy.staleness(request.base_version, session.aggregator.current_version)
        except RequestRefusedError:
            await self.count_rejection(session, pid)
            raise
        return None

    async def push(
        self, session: Session, pid: str, request: PushRequest, tensors: NamedTensors
    ) -> PushResult:
        """Acknowledge a new update once it is durable; a concurrent twin waits for its answer."""
        key = (pid, request.sequence)
        known = await self.check(session, pid, request)
        if known is not None:
            return known
        done: asyncio.Future[PushResult] = asyncio.get_running_loop().create_future()
        session.in_flight[key] = done
        try:
            await session.aggregator.wait_for_room(self._max_pending)
            result = await self._accept(session, pid, request, tensors)
        except BaseException as exc:
            done.set_exception(exc)
            # Nobody else may be waiting; mark the exception seen.
            done.exception()
            raise
        finally:
            del session.in_flight[key]
        done.set_result(result)
        return result

    async def count_rejection(self, session: Session, pid: str) -> None:
        """Count a refused update against its participant."""
        now = now_ms()
        await self._db(lambda db: db.count_rejection(session.name, pid, now))

    async def _accept(
        self, session: Session, pid: str, request: PushRequest, tensors: NamedTensors
    ) -> PushResult:
        strategy = session.strategy
        try:
            # A pass or two over every value: off the event loop, like the decoding.
            checked, norm = await asyncio.to_thread(_checked_update, session.spec, tensors)
            snapshot = session.aggregator.snapshot
            strategy.check_norm(
                norm,
                version=snapshot.version if snapshot else -1,
                model=snapshot.tensors if snapshot else None,
            )
            current = session.aggregator.current_version
            staleness = strategy.staleness(request.base_version, current)
        except RequestRefusedError:
            await self.count_rejection(session, pid)
            raise
        weight = strategy.weight(request.samples, staleness)
        append = functools.partial(
            session.update_log.append,
            session=session.name,
            participant_id=pid,
            sequence=request.sequence,
            base_version=request.base_version,
            samples=request.samples,
            env_steps=request.env_steps,
            episodes=request.episodes,
            weight=weight,
            staleness=staleness,
            metrics=dict(request.metrics),
            tensors=checked,
            received_unix_ms=now_ms(),
        )
        # Shielded: a client that hangs up must not stop an update between
        # the log and the buffer, or it would be acknowledged but not applied.
        return await asyncio.shield(
            self._log_and_queue(session, pid, request.sequence, append, norm)
        )

    async def _log_and_queue(
        self,
        session: Session,
        pid: str,
        sequence: int,
        append: Callable[[], LoggedUpdate],
        norm: float,
    ) -> PushResult:
        # Until this update is in the buffer, the log must keep every record
        # above the LSN it had before the append (see discard_watermark).
        token = object()
        session.append_floors[token] = session.update_log.last_lsn
        try:
            logged = await asyncio.to_thread(append)
            stored = await self.acknowledge(session, logged, norm)
            if stored is None:
                # Acknowledged before, through another record: answer as then.
                return await self._stored_answer(session, pid, sequence)
            session.aggregator.submit(logged)
            session.strategy.accepted(norm)
        finally:
            del session.append_floors[token]
        return _result_from_ack(stored, duplicate=False)

    async def acknowledge(
        self, session: Session, update: LoggedUpdate, norm: float
    ) -> AckRow | None:
        """Store the ack row and move the counters; None if this push was acknowledged before.

        Also used at recovery, for updates logged but never acknowledged. The
        row keeps the update's norm: the strategy's norm bound reads the
        newest ones back at recovery.
        """
        ack = AckRow(
            session=session.name,
            participant_id=update.participant_id,
            sequence=update.sequence,
            lsn=update.lsn,
            base_version=update.base_version,
            current_version=update.acked_version,
            staleness=update.staleness,
            weight=update.weight,
            episodes=update.episodes,
            env_steps=update.env_steps,
            # Filled in by StateDB.record_acks from the session's totals.
            goal_total=0,
            goal_done=0,
            received_ms=update.received_unix_ms,
            eval_return=update.metrics.get("eval_return"),
            base_eval_return=update.metrics.get("base_eval_return"),
            evaluated_version=(
                int(update.metrics["evaluated_version"])
                if "evaluated_version" in update.metrics
                else None
            ),
            norm=norm,
        )
        stored = await self._acks.record(ack)
        if stored is None:
            return None
        # Completions may arrive out of order; the database's totals only grow.
        session.episodes_done = max(session.episodes_done, stored.goal_done)
        session.last_sequences[stored.participant_id] = max(
            stored.sequence, session.last_sequences.get(stored.participant_id, 0)
        )
        if stored.base_eval_return is not None:
            await self._refresh_best(session)
        if session.goal.reached:
            session.notify()
        return stored

    async def still_pending(self, session: Session, update: LoggedUpdate) -> bool:
        """At recovery: does this logged update still have to go into a version?

        Yes if it was never acknowledged (a crash between the log and the ack
        row: it is acknowledged now) or acknowledged but not yet applied. No
        if a version holds it, or if it is a second record of the same push
        (a retry after a failed ack): the ack row names the record it stands for.
        """
        key = (session.name, update.participant_id, update.sequence)
        ack = await self._db(lambda db: db.find_ack(*key))
        if ack is None:
            norm = l2_norm([tensor for _, tensor in update.tensors])
            await self.acknowledge(session, update, norm)
            return True
        return ack.lsn == update.lsn and ack.applied_version is None

    async def _stored_answer(self, session: Session, pid: str, sequence: int) -> PushResult:
        ack = await self._db(lambda db: db.find_ack(session.name, pid, sequence))
        if ack is None:
            last = session.last_sequences.get(pid, 0)
            raise PreconditionError(
                f"sequence {sequence} is below the last acknowledged {last} and was never "
                "acknowledged; sequence numbers must increase"
            )
        await self._count_duplicate(session, pid)
        return _result_from_ack(ack, duplicate=True)

    async def _count_duplicate(self, session: Session, pid: str) -> None:
        now = now_ms()
        await self._db(lambda db: db.count_duplicate(session.name, pid, now))

    async def _refresh_best(self, session: Session) -> None:
        best = await self._db(lambda db: db.best_version(session.name))
        if best is not None:
            session.aggregator.note_best(best[0])

    # Pull.


def _result_from_ack(ack: AckRow, *, duplicate: bool) -> PushResult:
    return PushResult(
        sequence=ack.sequence,
        duplicate=duplicate,
        current_version=ack.current_version,
        staleness=ack.staleness,
        weight=ack.weight,
        goal=goal_state(ack.goal_total, ack.goal_done),
    )


def _as_duplicate(result: PushResult) -> PushResult:
    return PushResult(
        sequence=result.sequence,
        duplicate=True,
        current_version=result.current_version,
        staleness=result.staleness,
        weight=result.weight,
        goal=result.goal,
    )


def _checked_update(spec: tpb.ModelSpec, tensors: NamedTensors) -> tuple[NamedTensors, float]:
    """The update as the session takes it (float32, in the spec's order) and its L2 norm."""
    checked = check_tensors(spec, tensors, what="update")
    return checked, l2_norm([tensor for _, tensor in checked])
