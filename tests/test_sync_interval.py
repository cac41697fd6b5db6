"""When progress is due to leave: episodes, env steps, whichever comes first."""

from __future__ import annotations

import pytest

from fedrl.client.federation.sync_interval import SyncInterval


@pytest.mark.parametrize(
    ("interval", "episodes", "env_steps", "due"),
    [
        (SyncInterval(episodes=2), 1, 10_000, False),
        (SyncInterval(episodes=2), 2, 0, True),
        (SyncInterval(episodes=2, env_steps=256), 0, 255, False),
        (SyncInterval(episodes=2, env_steps=256), 0, 256, True),
        (SyncInterval(episodes=2, env_steps=256), 2, 3, True),
    ],
)
def test_whichever_comes_first_makes_a_sync_due(
    interval: SyncInterval, episodes: int, env_steps: int, due: bool
) -> None:
    assert interval.due(episodes=episodes, env_steps=env_steps, total_env_steps=env_steps) is due


@pytest.mark.parametrize(
    ("episodes", "env_steps", "named"), [(0, 0, "episode"), (2, -1, "sync steps")]
)
def test_an_interval_that_could_never_or_always_fire_is_refused(
    episodes: int, env_steps: int, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        SyncInterval(episodes=episodes, env_steps=env_steps)


@pytest.mark.parametrize(
    ("pushed_at", "now", "due"),
    [
        (0, 112, False),
        (0, 128, True),
        (120, 240, True),  # 120 steps since the push, yet a multiple of 128 was passed
        (128, 250, False),
        (250, 355, True),
        (256, 256, False),  # nothing since the push
        (0, 1000, True),  # several rounds at once are one sync
    ],
)
def test_steps_only_syncs_fall_due_at_each_multiple_of_the_count(
    pushed_at: int, now: int, due: bool
) -> None:
    interval = SyncInterval(episodes=0, env_steps=128)
    assert interval.due(episodes=50, env_steps=now - pushed_at, total_env_steps=now) is due
