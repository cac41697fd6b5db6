"""Ape-X exploration rates: ε_i = base^(1 + alpha·i/(N−1)) over all envs."""

from __future__ import annotations

import numpy as np
import pytest

from fedrl.client.training.exploration import actor_epsilons, apex_epsilons


def test_apex_schedule_matches_the_paper_formula() -> None:
    # prepare
    n = 8

    # act
    eps = apex_epsilons(n)

    # assert
    expected = [0.4 ** (1 + 7 * i / (n - 1)) for i in range(n)]
    np.testing.assert_allclose(eps, expected)
    assert eps[0] == pytest.approx(0.4)
    assert eps[-1] == pytest.approx(0.4**8)


def test_base_and_exponent_are_configurable() -> None:
    eps = apex_epsilons(3, base=0.5, alpha=2.0)

    np.testing.assert_allclose(eps, [0.5, 0.25, 0.125])


def test_a_single_env_gets_the_base_rate() -> None:
    assert apex_epsilons(1).tolist() == [0.4]


def test_actors_share_one_schedule_over_all_their_envs() -> None:
    # prepare
    actors, envs = 3, 4

    # act
    per_actor = [actor_epsilons(i, actors, envs, base=0.4, alpha=7.0) for i in range(actors)]

    # assert: together exactly the global schedule, each actor spanning greedy to exploring
    together = np.sort(np.concatenate(per_actor))
    np.testing.assert_allclose(together, np.sort(apex_epsilons(actors * envs)))
    for eps in per_actor:
        assert len(eps) == envs
        assert eps.max() > 0.1 and eps.min() < 0.01


@pytest.mark.parametrize(
    ("count", "base", "alpha", "message"),
    [(0, 0.4, 7.0, "at least one env"), (4, 1.0, 7.0, "base"), (4, 0.4, -1.0, "exponent")],
)
def test_bad_schedules_are_refused(count: int, base: float, alpha: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apex_epsilons(count, base=base, alpha=alpha)
