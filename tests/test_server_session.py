"""The domain rules of server/federation/, called directly: no gRPC in between."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.federation.federation import Federation
from fedrl.server.federation.session import PushRequest
from fedrl.server.refusals import InvalidRequestError, NotFoundError, PreconditionError
from fedrl.server.status.read_model import ServerStatus
from fedrl.server.strategy.fedavg import FedAvg
from tests.support.server_harness import make_spec, server_config

T = TypeVar("T")
SPEC = make_spec([(4,)])
HASH = spec_hash(SPEC)


def run(tmp_path: Path, scenario: Callable[[Federation], Awaitable[T]], **overrides: object) -> T:
    """Open a Federation on tmp_path, seed it as alice, run the scenario, close it."""

    async def main() -> T:
        federation = await Federation.open(server_config(tmp_path / "data", **overrides))
        try:
            await federation.join("default", "alice", SPEC, HASH)
            await federation.seed("default", "alice", HASH, [("t0", np.zeros(4, np.float32))])
            return await scenario(federation)
        finally:
            await federation.close()

    return asyncio.run(main())


def request(sequence: int, *, base_version: int = 0, **changes: object) -> PushRequest:
    fields: dict[str, object] = {
        "session": "default",
        "participant_id": "alice",
        "sequence": sequence,
        "base_version": base_version,
        "env_steps": 10,
        "episodes": 1,
        "samples": 10,
        "spec_hash": HASH,
    }
    fields.update(changes)
    return PushRequest(**fields)  # type: ignore[arg-type]


def ones() -> list[tuple[str, np.ndarray]]:
    return [("t0", np.ones(4, np.float32))]


def test_two_concurrent_copies_of_a_push_are_applied_once(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> tuple[bool, bool, int]:
        first, second = await asyncio.gather(
            federation.push(request(1), ones()), federation.push(request(1), ones())
        )
        await federation.session("default").aggregator.close()
        return (
            first.duplicate,
            second.duplicate,
            federation.session("default").aggregator.current_version,
        )

    first, second, version = run(tmp_path, scenario, buffer_size=1)

    assert sorted([first, second]) == [False, True]
    assert version == 1


def test_sequence_below_the_last_acked_that_was_never_acked_is_refused(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> None:
        await federation.push(request(5), ones())
        await federation.push(request(3), ones())

    with pytest.raises(PreconditionError, match="sequence 3 is below the last acknowledged 5"):
        run(tmp_path, scenario)


def test_non_finite_metrics_are_invalid(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> None:
        await federation.push(request(1, metrics={"mean_return": float("nan")}), ones())

    with pytest.raises(InvalidRequestError, match="mean_return"):
        run(tmp_path, scenario)


def test_a_participant_that_never_joined_cannot_push(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> None:
        await federation.push(request(1, participant_id="mallory"), ones())

    with pytest.raises(PreconditionError, match="call Join first"):
        run(tmp_path, scenario)


def test_pull_from_the_newest_version_itself_is_an_all_zero_delta(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> tuple[bool, np.ndarray]:
        view = await federation.model("default", version=-1, have_version=0)
        return view.is_delta, view.tensors[0][1]

    is_delta, tensor = run(tmp_path, scenario)

    assert is_delta
    np.testing.assert_array_equal(tensor, np.zeros(4, np.float32))


def test_pull_of_a_version_that_never_existed_is_not_found(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> None:
        await federation.model("default", version=7, have_version=-1)

    with pytest.raises(NotFoundError, match="version 7"):
        run(tmp_path, scenario)


def test_leave_marks_the_participant_left_and_rejoin_makes_it_active(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> tuple[int, str, int]:
        await federation.leave("default", "alice")
        left = federation.notice("default").active_participants
        status = await ServerStatus(federation).read("default", 0)
        await federation.join("default", "alice", SPEC, HASH)
        return (
            left,
            status.sessions[0].participants[0].status,
            federation.notice("default").active_participants,
        )

    left, status, rejoined = run(tmp_path, scenario)

    assert (left, status, rejoined) == (0, "left", 1)


def test_nfc_and_nfd_spellings_of_an_id_are_one_participant(tmp_path: Path) -> None:
    nfd = "Ame\u0301lie"  # e + combining accent; NFC is "Amélie"

    async def scenario(federation: Federation) -> list[str]:
        await federation.join("default", "Am\u00e9lie", SPEC, HASH)
        await federation.join("default", nfd, SPEC, HASH)
        status = await ServerStatus(federation).read("default", 0)
        return [p.participant_id for p in status.sessions[0].participants]

    assert run(tmp_path, scenario) == ["alice", "Am\u00e9lie"]


def test_a_claimed_spec_hash_that_does_not_match_the_spec_is_invalid(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> None:
        await federation.join("default", "bob", SPEC, "0" * 64)

    with pytest.raises(InvalidRequestError, match="does not match"):
        run(tmp_path, scenario)


def test_a_spec_with_integer_tensors_is_refused_before_it_fixes_a_session(tmp_path: Path) -> None:
    ints = make_spec([(4,)])
    ints.tensors[0].dtype = tpb.DTYPE_INT64

    async def scenario(federation: Federation) -> None:
        await federation.join("other", "bob", ints, spec_hash(ints))

    with pytest.raises(InvalidRequestError, match="float32"):
        run(tmp_path, scenario)


@pytest.mark.parametrize("where", ["observation", "tensor"])
def test_a_spec_with_thousands_of_huge_dimensions_is_refused_in_a_short_message(
    tmp_path: Path, where: str
) -> None:
    """5,000 dimensions of 2^62: their product has too many digits for Python to print."""
    huge = make_spec([(4,)])
    shape = huge.observation_space.shape if where == "observation" else huge.tensors[0].shape
    del shape[:]
    shape.extend([2**62] * 5_000)

    async def scenario(federation: Federation) -> None:
        await federation.join("other", "bob", huge, spec_hash(huge))

    with pytest.raises(InvalidRequestError, match="5000 dimensions") as refused:
        run(tmp_path, scenario)
    assert len(str(refused.value)) < 300


def push_three(values: tuple[float, ...]) -> Callable[[Federation], Awaitable[np.ndarray]]:
    """A scenario: alice, bob and carol push constant deltas; returns version 1."""

    async def scenario(federation: Federation) -> np.ndarray:
        for pid in ("bob", "carol"):
            await federation.join("default", pid, SPEC, HASH)
        for pid, value in zip(("alice", "bob", "carol"), values, strict=True):
            delta = [("t0", np.full(4, value, np.float32))]
            await federation.push(request(1, participant_id=pid), delta)
        await federation.session("default").aggregator.close()
        view = await federation.model("default", version=1, have_version=-1)
        return view.tensors[0][1]

    return scenario


def test_median_strategy_from_the_config_ignores_an_outlier(tmp_path: Path) -> None:
    result = run(tmp_path, push_three((1.0, 2.0, 100.0)), buffer_size=3, strategy="median")

    np.testing.assert_allclose(result, 2.0)


def test_clip_norm_bounds_each_update_before_averaging(tmp_path: Path) -> None:
    # Each delta has norm 2 * value (4 coordinates); clipped to norm 1: 0.5 per coordinate.
    result = run(tmp_path, push_three((3.0, 3.0, 3.0)), buffer_size=3, clip_norm=1.0)

    np.testing.assert_allclose(result, 0.5, rtol=1e-6)


def test_an_injected_strategy_replaces_the_configured_one(tmp_path: Path) -> None:
    class FirstOnly(FedAvg):
        name = "first"

        def aggregate(
            self, deltas: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
        ) -> list[np.ndarray]:
            return [np.asarray(t, np.float32) for t in deltas[0]]

    async def main() -> np.ndarray:
        config = server_config(tmp_path / "data", buffer_size=3)
        federation = await Federation.open(config, strategy=FirstOnly)
        try:
            await federation.join("default", "alice", SPEC, HASH)
            await federation.seed("default", "alice", HASH, [("t0", np.zeros(4, np.float32))])
            return await push_three((7.0, 1.0, 1.0))(federation)
        finally:
            await federation.close()

    np.testing.assert_allclose(asyncio.run(main()), 7.0)


def test_concurrent_pushes_count_every_episode_toward_the_goal(tmp_path: Path) -> None:
    async def scenario(federation: Federation) -> tuple[list[int], int]:
        for pid in ("bob", "carol"):
            await federation.join("default", pid, SPEC, HASH)
        replies = await asyncio.gather(
            *(
                federation.push(request(1, participant_id=pid, episodes=episodes), ones())
                for pid, episodes in (("alice", 3), ("bob", 4), ("carol", 5))
            )
        )
        done = federation.notice("default").goal.episodes_done
        return sorted(r.goal.episodes_done for r in replies), done

    answers, done = run(tmp_path, scenario)

    assert done == 12
    assert answers[-1] == 12  # the last acknowledged push saw every episode
