"""The experience exchange's rules without gRPC: membership, validation, exactly-once, budgets."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from fedrl.common.experience import decode_batch
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.experience.exchange import ExperienceExchange
from fedrl.server.federation.federation import Federation
from fedrl.server.refusals import InvalidRequestError, NotFoundError, PreconditionError
from tests.support.experience import CONFIG, SPEC_HASH, assert_same_batch, cartpole_spec, make_batch
from tests.support.server_harness import server_config

T = TypeVar("T")


def run(tmp_path: Path, scenario: Callable[[ExperienceExchange], Awaitable[T]]) -> T:
    """alice and bob join a session through the Federation; the scenario runs on the exchange."""

    async def main() -> T:
        data_dir = tmp_path / "data"
        federation = await Federation.open(server_config(data_dir))
        exchange = ExperienceExchange(data_dir, CONFIG)
        try:
            for pid in ("alice", "bob"):
                await federation.join("default", pid, cartpole_spec(), SPEC_HASH)
            return await scenario(exchange)
        finally:
            await exchange.close()
            await federation.close()

    return asyncio.run(main())


def test_a_batch_pushed_by_one_member_is_pulled_by_the_other_only(tmp_path: Path) -> None:
    batch = make_batch(30, seed=1)

    async def scenario(exchange: ExperienceExchange) -> tuple[int, int, int]:
        await exchange.push("default", "alice", 1, batch)
        bobs, _ = await exchange.pull("default", "bob", cursor=0, max_transitions=0)
        alices, _ = await exchange.pull("default", "alice", cursor=0, max_transitions=0)
        got = decode_batch(bobs[0].header, bobs[0].block, bobs[0].data)
        assert_same_batch(got, batch)
        return len(bobs), len(alices), bobs[0].header.sequence

    assert run(tmp_path, scenario) == (1, 0, 1)


def test_a_repeated_sequence_is_answered_as_a_duplicate_and_stored_once(tmp_path: Path) -> None:
    async def scenario(exchange: ExperienceExchange) -> tuple[bool, bool, int]:
        first = await exchange.push("default", "alice", 1, make_batch(10, seed=1))
        again = await exchange.push("default", "alice", 1, make_batch(10, seed=2))
        pulled, _ = await exchange.pull("default", "bob", cursor=0, max_transitions=0)
        return first.duplicate, again.duplicate, len(pulled)

    assert run(tmp_path, scenario) == (False, True, 1)


def test_pushes_of_strangers_and_to_unknown_sessions_are_refused(tmp_path: Path) -> None:
    async def scenario(exchange: ExperienceExchange) -> None:
        with pytest.raises(PreconditionError, match="has not joined"):
            await exchange.check_push("default", "mallory", 1)
        with pytest.raises(NotFoundError, match="no session named 'other'"):
            await exchange.push("other", "alice", 1, make_batch(10))
        with pytest.raises(
            InvalidRequestError, match=r"ExperienceHeader\.sequence is 0; it must lie in 1"
        ):
            await exchange.check_push("default", "alice", 0)

    run(tmp_path, scenario)


def test_an_invalid_batch_is_refused_with_its_reason_and_counted(tmp_path: Path) -> None:
    bad = dataclasses.replace(make_batch(10), action=np.full(10, 7, np.int64))

    async def scenario(exchange: ExperienceExchange) -> int:
        with pytest.raises(InvalidRequestError, match=r"batch 1 refused: .*action"):
            await exchange.push("default", "alice", 1, bad)
        pulled, _ = await exchange.pull("default", "bob", cursor=0, max_transitions=0)
        return len(pulled)

    assert run(tmp_path, scenario) == 0


def test_a_budget_below_one_batch_gets_the_whole_batch(tmp_path: Path) -> None:
    batch = make_batch(40, seed=3)

    async def scenario(exchange: ExperienceExchange) -> tuple[int, int]:
        await exchange.push("default", "alice", 1, batch)
        pulled, cursor = await exchange.pull("default", "bob", cursor=0, max_transitions=15)
        got = decode_batch(pulled[0].header, pulled[0].block, pulled[0].data)
        assert_same_batch(got, batch)
        return len(got.action), cursor

    assert run(tmp_path, scenario) == (40, 1)


def test_a_batch_asked_for_uncompressed_carries_the_same_rows(tmp_path: Path) -> None:
    batch = make_batch(20, seed=4)

    async def scenario(exchange: ExperienceExchange) -> int:
        await exchange.push("default", "alice", 1, batch)
        (stored,), _ = await exchange.pull("default", "bob", cursor=0, max_transitions=0)
        plain = exchange.in_codec(stored, tpb.CODEC_NONE)
        assert_same_batch(decode_batch(plain.header, plain.block, plain.data), batch)
        return int(plain.block.codec)

    assert run(tmp_path, scenario) == tpb.CODEC_NONE
