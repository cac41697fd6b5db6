"""The state a strategy carries survives a restart: the momentum velocity and the recent norms."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from fedrl.common.spec import spec_hash
from fedrl.server.federation.federation import Federation
from fedrl.server.federation.session import PushRequest
from fedrl.server.federation.versions import VELOCITY_DIR
from fedrl.server.names import session_dir
from fedrl.server.refusals import InvalidRequestError
from fedrl.server.storage.model_store import ModelStore
from tests.support.server_harness import make_spec, server_config

T = TypeVar("T")
SPEC = make_spec([(4,)])
HASH = spec_hash(SPEC)


def run(data: Path, scenario: Callable[[Federation], Awaitable[T]], **overrides: Any) -> T:
    """Open a Federation on `data` (alice joined), run the scenario, close it."""

    async def main() -> T:
        federation = await Federation.open(server_config(data, buffer_size=1, **overrides))
        try:
            await federation.join("default", "alice", SPEC, HASH)
            return await scenario(federation)
        finally:
            await federation.close()

    return asyncio.run(main())


async def seed(federation: Federation) -> None:
    await federation.seed("default", "alice", HASH, [("t0", np.zeros(4, np.float32))])


async def push(federation: Federation, sequence: int, base: int, value: float) -> np.ndarray:
    """Push a delta of `value` everywhere and wait for its version; the new global."""
    request = PushRequest("default", "alice", sequence, base, 10, 1, 10, HASH)
    await federation.push(request, [("t0", np.full(4, value, np.float32))])
    session = federation.session("default")
    while session.aggregator.current_version < base + 1:
        await asyncio.wait_for(session.changed.wait(), timeout=30)
    snapshot = session.aggregator.snapshot
    assert snapshot is not None
    return snapshot.tensors[0]


def velocities(data: Path) -> ModelStore:
    return ModelStore(session_dir(data, "default") / VELOCITY_DIR)


def test_the_momentum_velocity_survives_a_restart(tmp_path: Path) -> None:
    # momentum 0.5, lr 1: v1 = 2, g1 = 2; after the restart v2 = 0.5 * 2 + 1 = 2, g2 = 4
    # (a velocity lost in the restart would give g2 = 3).
    data = tmp_path / "data"

    async def before(federation: Federation) -> np.ndarray:
        await seed(federation)
        return await push(federation, 1, 0, 2.0)

    async def after(federation: Federation) -> np.ndarray:
        return await push(federation, 2, 1, 1.0)

    first = run(data, before, server_momentum=0.5)
    second = run(data, after, server_momentum=0.5)

    assert first.tolist() == [2.0] * 4
    assert second.tolist() == [4.0] * 4
    # Only the newest version's velocity is kept: the next version starts from it.
    assert velocities(data).versions() == [2]
    assert velocities(data).load(2)[0][1].tolist() == [2.0] * 4


def test_a_velocity_written_for_a_version_that_never_committed_is_not_used(
    tmp_path: Path,
) -> None:
    # A kill between the velocity file and the version row leaves a file for version 2.
    data = tmp_path / "data"

    async def before(federation: Federation) -> np.ndarray:
        await seed(federation)
        return await push(federation, 1, 0, 2.0)

    run(data, before, server_momentum=0.5)
    velocities(data).write(2, [("t0", np.full(4, 100.0, np.float32))])

    second = run(data, lambda federation: push(federation, 2, 1, 1.0), server_momentum=0.5)

    assert second.tolist() == [4.0] * 4


def test_the_norms_of_accepted_updates_survive_a_restart(tmp_path: Path) -> None:
    # Four updates of norm 1 (0.5 in each of 4 coordinates) make the median 1, so the
    # bound is 20. Forgotten, the reference would be the model's norm, 4 (2.0 x 4
    # coordinates after the four versions), and an update of norm 30 would pass.
    data = tmp_path / "data"

    async def before(federation: Federation) -> None:
        await seed(federation)
        for sequence in range(1, 5):
            await push(federation, sequence, sequence - 1, 0.5)

    async def after(federation: Federation) -> None:
        request = PushRequest("default", "alice", 5, 4, 10, 1, 10, HASH)
        await federation.push(request, [("t0", np.full(4, 15.0, np.float32))])

    run(data, before)

    with pytest.raises(InvalidRequestError, match="median norm 1 of the session's last 4"):
        run(data, after)
