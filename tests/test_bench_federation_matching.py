"""Compute matching: the replay ratio a reference runs at, found from a group's measured rate."""

from __future__ import annotations

import pytest

from bench.federation import matching
from bench.federation.matching import Attempt, MatchingError
from bench.federation.results import RunResult
from bench.federation.settings import Configuration, Settings
from bench.federation.sweep import Sweep
from tests.support.benches import make_run


def test_the_first_guess_makes_up_for_the_warm_up() -> None:
    # Updates start after 1,000 of 12,000 steps: 11/12 of the steps must carry them all.
    assert matching.first_guess(1.0, 12_000, 1_000) == pytest.approx(12 / 11)
    assert matching.first_guess(2.0, 4_000, 0) == 2.0


def test_a_rate_that_cannot_be_matched_is_refused_with_what_to_do() -> None:
    with pytest.raises(MatchingError, match="must be positive"):
        matching.first_guess(0.0, 12_000, 1_000)
    with pytest.raises(MatchingError, match="lower learning_starts"):
        matching.first_guess(1.0, 1_000, 1_000)
    with pytest.raises(MatchingError, match="made no updates"):
        matching.corrected(Attempt(1.0, 0.0), 1.0)


def test_rates_match_within_five_percent() -> None:
    assert matching.within(1.04, 1.0) and matching.within(0.96, 1.0)
    assert not matching.within(1.06, 1.0) and not matching.within(0.94, 1.0)
    assert matching.within(0.0, 0.0) and not matching.within(0.1, 0.0)


def test_a_miss_scales_the_replay_ratio_by_how_far_it_fell() -> None:
    assert matching.corrected(Attempt(replay_ratio=1.2, achieved=0.8), 1.0) == pytest.approx(1.5)


def test_a_guess_within_five_percent_is_run_once() -> None:
    measured: list[float] = []

    def measure(ratio: float) -> float:
        measured.append(ratio)
        return ratio * 0.98

    attempts = matching.match(1.0, 1.0, measure)

    assert attempts == [Attempt(1.0, 0.98)]
    assert measured == [1.0]


def test_a_miss_beyond_five_percent_triggers_a_correction() -> None:
    # prepare: a learner whose warm-up costs it 30 % of its updates.
    attempts = matching.match(1.0, 1.0, lambda ratio: 0.7 * ratio)

    assert [a.replay_ratio for a in attempts] == pytest.approx([1.0, 1 / 0.7])
    assert matching.within(attempts[-1].achieved, 1.0)


def test_matching_gives_up_after_its_tries_and_says_so_by_the_last_rate() -> None:
    attempts = matching.match(1.0, 1.0, lambda ratio: 0.5, tries=3)

    assert len(attempts) == 3
    assert not matching.within(attempts[-1].achieved, 1.0)


GROUP_RATES = {"dqn both N=2": 1.3, "dqn weights N=2": 0.46, "dqn both N=1": 0.44}
LONE_EFFICIENCY = 0.9
"""The fake lone learner's updates per step over its replay ratio (its warm-up)."""
POOLED_EFFICIENCY = 0.95


def fake_rate(configuration: Configuration) -> float:
    ratio = configuration.replay_ratio or 0.5
    if configuration.mode == "offline":
        return ratio * LONE_EFFICIENCY
    if configuration.mode == "pooled":
        return ratio * POOLED_EFFICIENCY
    return GROUP_RATES[configuration.key]


def fake_run(configuration: Configuration, seed: int) -> RunResult:
    """A run whose updates per step are the fake rate at every mark, scored 0 throughout."""
    return make_run(
        configuration.mode,
        configuration.n,
        seed,
        [0.0] * 20,
        replay_ratio=configuration.replay_ratio,
        updates_per_step=fake_rate(configuration),
    )


class Recorder:
    """fake_run, noting every (configuration key, seed) it ran."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, int]] = []

    def __call__(self, configuration: Configuration, seed: int) -> RunResult:
        self.ran.append((configuration.key, seed))
        return fake_run(configuration, seed)


def test_the_lone_reference_runs_at_the_ratio_that_makes_the_groups_rate() -> None:
    # prepare: the pair makes 1.3 updates per own env step; the default lone learner 0.45.
    run = Recorder()
    sweep = Sweep(run, [0, 1, 2], Settings(), say=lambda line: None)

    # act
    measured = sweep.measure(Configuration(2, "both"))

    # assert: the default lone learner shows that a lone learner makes 0.9 of its ratio, so
    # the first ratio tried is 1.3 / 0.9, and it matches at once.
    matched = measured.compute_matched
    assert matched.configuration.replay_ratio == pytest.approx(1.3 / LONE_EFFICIENCY)
    assert [a.replay_ratio for a in matched.attempts] == [matched.configuration.replay_ratio]
    assert matched.matched and matched.achieved == pytest.approx(1.3, rel=1e-3)
    assert [r.seed for r in matched.runs] == [0, 1, 2]
    assert not measured.default_lone.matched


def test_a_pooled_reference_that_misses_is_corrected_on_the_first_seed() -> None:
    run = Recorder()
    sweep = Sweep(run, [0, 1], Settings(), say=lambda line: None)

    pooled = sweep.measure(Configuration(2, "both")).pooled

    # The warm-up guess (updates from 1,000 of its own steps, 500 each, counted over 2,000
    # each) is 1.3 * 2,000 / 1,500; the fake pooled learner then makes 0.95 of it, more than
    # 5 % off, and is corrected to 1.3 / 0.95.
    assert [a.replay_ratio for a in pooled.attempts] == pytest.approx(
        [1.3 * 2_000 / 1_500, 1.3 / POOLED_EFFICIENCY], rel=1e-3
    )
    assert pooled.matched
    assert pooled.configuration.n == 2 and pooled.configuration.mode == "pooled"
    # The first seed ran at both ratios, the second at the last one only.
    pooled_runs = [(key, seed) for key, seed in run.ran if "pooled" in key]
    assert [seed for _, seed in pooled_runs] == [0, 0, 1]
    assert [r.configuration for r in pooled.runs] == [pooled.configuration] * 2


def test_a_reference_already_run_at_a_matching_rate_is_used_again() -> None:
    # prepare: a pair sharing weights only makes 0.46 updates per step, within 5 % of the
    # default lone learner's 0.45; an earlier pair's pooled learner ran at 1.3.
    run = Recorder()
    sweep = Sweep(run, [0, 1], Settings(), say=lambda line: None)
    sweep.measure(Configuration(2, "both"))
    before = len(run.ran)

    # act
    measured = sweep.measure(Configuration(2, "weights"))

    # assert: no lone learner runs again; the pooled one is calibrated from the earlier
    # pooled learner's rate and matches at its first ratio.
    assert measured.compute_matched.configuration == Configuration(1, "offline")
    assert measured.compute_matched.matched
    new = run.ran[before:]
    assert [key for key, _ in new if "offline" in key] == []
    assert len(measured.pooled.attempts) == 1
    assert measured.pooled.configuration.replay_ratio == pytest.approx(
        0.46 / POOLED_EFFICIENCY, rel=1e-3
    )


def test_a_lone_member_is_its_own_pool() -> None:
    sweep = Sweep(Recorder(), [0], Settings(), say=lambda line: None)

    measured = sweep.measure(Configuration(1, "both"))

    assert measured.pooled is measured.compute_matched


def test_a_group_that_made_no_updates_has_nothing_to_match() -> None:
    GROUP_RATES["dqn experience N=2"] = 0.0
    try:
        sweep = Sweep(Recorder(), [0], Settings(), say=lambda line: None)
        with pytest.raises(MatchingError, match="made no updates"):
            sweep.measure(Configuration(2, "experience"))
    finally:
        del GROUP_RATES["dqn experience N=2"]
