"""With the defaults, a group's global model learns, and sooner per participant than one alone.

The runs are bench.federation's, so the test exercises exactly what the bench
measures: a `fedrl-server` process, participant processes in serial mode, and
the global model's checkpoints evaluated greedily after the run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.federation.runner import run_configuration
from bench.federation.settings import RECOMMENDED, Settings


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_participants_with_the_recommended_settings_improve_the_global_model(
    tmp_path: Path,
) -> None:
    configuration = replace(RECOMMENDED, n=2)
    # Small but past learning_starts (1,000) by a few thousand steps each.
    settings = Settings(budget_steps=5_000, eval_every=1_000, eval_episodes=5)

    result = run_configuration(configuration, 0, settings, tmp_path, timeout_s=480.0)

    assert result.total_versions > 2, "the server made hardly any global versions"
    final = [r for r in result.returns if r is not None]
    assert final, "no global model was evaluated"
    # An untrained greedy CartPole policy scores about 9-10; two participants'
    # global model balances far longer after 5,000 steps each.
    assert max(final) > result.initial_return + 20, (result.initial_return, result.returns)


@pytest.mark.slow
@pytest.mark.timeout(1_800)
def test_two_participants_with_the_defaults_reach_a_modest_target_in_fewer_steps_each_than_one(
    tmp_path: Path,
) -> None:
    """The issue's promise at its smallest: N = 2 against N = 1, same seeds and budget.

    The target is modest (CartPole 150 at two consecutive marks, where a
    lone participant needs 2,750-4,000 steps in bench.federation's runs)
    because near 475 this DQN's greedy score swings between marks and five
    seeds cannot separate the two; "most seeds" is 2 of 3.
    """
    settings = Settings(target=150.0, budget_steps=6_000, eval_every=250)
    steps: dict[int, tuple[int | None, int | None]] = {}
    for seed in (0, 1, 2):
        alone, group = (
            run_configuration(
                replace(RECOMMENDED, n=n), seed, settings, tmp_path, timeout_s=600.0
            ).steps_to_target
            for n in (1, 2)
        )
        steps[seed] = (alone, group)
    sooner = [
        seed
        for seed, (alone, group) in steps.items()
        if group is not None and (alone is None or group < alone)
    ]
    assert len(sooner) >= 2, f"steps to target per seed (alone, group): {steps}"
