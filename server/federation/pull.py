"""Pulls: a session's global model as PullModel streams it, whole or as a delta.

The newest version comes from memory (the aggregator's snapshot); an older
one from its checkpoint while retention keeps it. A client that still holds
a retained version gets the delta from it, which compresses far better.
"""

from __future__ import annotations

import asyncio

import numpy as np

from fedrl.server.federation.aggregator import Snapshot
from fedrl.server.federation.session import ModelView, Session
from fedrl.server.refusals import NotFoundError, PreconditionError
from fedrl.server.storage.db_runner import DbRunner


async def model_view(
    db: DbRunner, session: Session, version: int, have_version: int, participant_id: str
) -> ModelView:
    """The tensors PullModel streams: the full model, or a delta when have_version is kept.

    With a participant id, also which of its updates the version includes.
    """
    snapshot = session.aggregator.snapshot
    if snapshot is None:
        raise PreconditionError(f"session {session.name!r} has no model yet")
    target = snapshot.version if version < 0 else version
    tensors = await _load(session, snapshot, target)
    names = [t.name for t in session.spec.tensors]
    # A delta from the version the client holds, when it is still here;
    # from the newest version itself it is all zeros, which costs nothing.
    have_kept = have_version >= 0 and (
        have_version == snapshot.version or session.store.has(have_version)
    )
    if have_kept:
        base = await _load(session, snapshot, have_version)
        tensors = await asyncio.to_thread(_subtract, tensors, base)
    applied = (
        await db(lambda state: state.applied_sequence(session.name, participant_id, target))
        if participant_id
        else 0
    )
    return ModelView(
        session=session.name,
        version=target,
        from_version=have_version if have_kept else -1,
        is_delta=have_kept,
        spec_hash=session.spec_hash,
        tensors=list(zip(names, tensors, strict=True)),
        goal=session.goal,
        applied_sequence=applied,
    )


async def _load(session: Session, snapshot: Snapshot, version: int) -> list[np.ndarray]:
    if version == snapshot.version:
        return list(snapshot.tensors)
    if not 0 <= version <= snapshot.version or not session.store.has(version):
        raise NotFoundError(
            f"version {version} of session {session.name!r} is not retained; "
            f"the newest is {snapshot.version}"
        )
    try:
        loaded = await asyncio.to_thread(session.store.load, version)
    except FileNotFoundError:
        # Pruned by retention between the check above and the read.
        raise NotFoundError(
            f"version {version} of session {session.name!r} was just pruned; "
            f"the newest is {snapshot.version}"
        ) from None
    return [tensor for _, tensor in loaded]


def _subtract(minuend: list[np.ndarray], subtrahend: list[np.ndarray]) -> list[np.ndarray]:
    return [a - b for a, b in zip(minuend, subtrahend, strict=True)]
