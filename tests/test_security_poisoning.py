"""Model poisoning over real mTLS: robust strategies hold, the plain mean does not.

Three sessions of one server get the same attacked round: "plain" keeps the
server's weighted mean, "trimmed" and "median" get a robust strategy through
--session-strategy. Five participants train from the same global and would
all push a delta close to one common direction. Two of them attack: one
scales its delta by 100 (a boosting attack), one flips its sign. The clean
aggregate is what the server would make from the five honest deltas. The
stated tolerance:

    robust (trimmed mean, median):  ||global_1 - clean|| <= 0.25 * ||clean||
    plain weighted mean:            ||global_1 - clean|| >  10   * ||clean||

Both figures come from the arithmetic of the attack: honest deltas differ
from the common direction by noise of 0.1 per coordinate, so the trimmed mean
of the three middle values lies within a few tenths of the clean mean, while
the plain mean is pulled to about (3 + 100 - 1) / 5 = 20 times the direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from fedrl.server.strategy.registry import make_strategy
from tests.support.secure_federation import SecureFederation, seeded
from tests.support.server_harness import join, make_spec, pull, push

SPEC = make_spec([(16, 8), (8,)])
PARTICIPANTS = ["ana", "bo", "chen", "dara", "эва"]
BOOSTER, FLIPPER = "dara", "эва"
NOISE = 0.1
ROBUST_TOLERANCE = 0.25
POISONED_AT_LEAST = 10.0


def honest_deltas() -> dict[str, list[np.ndarray]]:
    """What each participant would push without any attack: direction + small noise."""
    rng = np.random.default_rng(7)
    direction = [rng.standard_normal(t.shape).astype(np.float32) for t in SPEC.tensors]
    return {
        pid: [d + NOISE * rng.standard_normal(d.shape).astype(np.float32) for d in direction]
        for pid in PARTICIPANTS
    }


def attacked(honest: dict[str, list[np.ndarray]]) -> dict[str, list[np.ndarray]]:
    sent = dict(honest)
    sent[BOOSTER] = [100 * t for t in honest[BOOSTER]]
    sent[FLIPPER] = [-t for t in honest[FLIPPER]]
    return sent


def flat(tensors: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(t, dtype=np.float64).ravel() for t in tensors])


STRATEGIES = {"plain": "mean", "trimmed": "trimmed_mean", "median": "median"}
"""Session -> the strategy --session-strategy gives it (plain keeps the server's mean)."""


@dataclass(frozen=True)
class Round:
    strategy: str
    """The strategy the session announced in JoinReply.config."""
    result: np.ndarray
    """Version 1 of the session, flattened."""


@pytest.fixture(scope="module")
def rounds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Round]:
    """One attacked round in each of three sessions of one server, each with its strategy."""
    sent = attacked(honest_deltas())
    zero = [np.zeros(tuple(t.shape)) for t in SPEC.tensors]
    found: dict[str, Round] = {}
    with SecureFederation(
        tmp_path_factory.mktemp("poisoning"),
        strategy="mean",
        session_strategy=("trimmed=trimmed_mean", "median=median"),
        trim_fraction=0.2,
        # All five updates in one version, whatever order they arrive in.
        buffer_size=len(PARTICIPANTS),
        buffer_timeout_s=120.0,
    ) as federation:
        for session in STRATEGIES:
            seeded(federation, PARTICIPANTS[0], SPEC, zero, session=session)
            announced = set()
            for pid in PARTICIPANTS:
                stub = federation.stub(pid)
                announced.add(join(stub, pid, SPEC, session=session).config.strategy)
                push(stub, pid, SPEC, sent[pid], sequence=1, base_version=0, session=session)
            federation.wait_for_version(PARTICIPANTS[0], 1, session)
            header, tensors, _ = pull(
                federation.stub(PARTICIPANTS[0]),
                session=session,
                version=1,
                participant_id=PARTICIPANTS[0],
            )
            assert header.version == 1
            (strategy,) = announced
            found[session] = Round(strategy, flat(tensors))
    return found


def relative_error(result: np.ndarray) -> float:
    clean = flat(make_strategy("mean").aggregate(list(honest_deltas().values()), [1.0] * 5))
    return float(np.linalg.norm(result - clean) / np.linalg.norm(clean))


@pytest.mark.parametrize("session", ["trimmed", "median"])
def test_robust_session_keeps_the_global_near_the_clean_aggregate(
    rounds: dict[str, Round], session: str
) -> None:
    found = rounds[session]

    error = relative_error(found.result)

    assert found.strategy == STRATEGIES[session]
    assert error <= ROBUST_TOLERANCE, f"{session}: relative error {error:.3f}"
    # And the server computed exactly the strategy's answer on what was sent.
    options = {"trim_fraction": 0.2} if found.strategy == "trimmed_mean" else {}
    sent = list(attacked(honest_deltas()).values())
    expected = flat(make_strategy(found.strategy, **options).aggregate(sent, [1.0] * 5))
    np.testing.assert_allclose(found.result, expected, rtol=1e-5, atol=1e-5)


def test_plain_mean_session_is_dragged_far_from_the_clean_aggregate(
    rounds: dict[str, Round],
) -> None:
    found = rounds["plain"]

    error = relative_error(found.result)

    assert found.strategy == "mean"
    assert error > POISONED_AT_LEAST, f"mean: relative error only {error:.3f}"
