"""How a participant syncs: in synchronous rounds or asynchronously, and its deltas' wire type.

The plan follows from the session's rules (fedrl.common.group_rules), the
same for every member, and the member's algorithm, which the session's model
spec fixes: so every member of a session runs the same plan. By default a
DQN participant pushing weights syncs asynchronously (every 2 episodes,
bfloat16 deltas) while it is the only member pushing weights, and in
synchronous rounds (of `--sync-steps`, 128 unless given, float32 deltas
unless `--delta-dtype` says otherwise, each waiting up to 5 s for its
version) from two on: the server's count of members whose updates it
heard within its active window (actors, experience-only members and
members that went quiet do not count). `--rounds-from N` moves the
threshold (1: rounds at any size), `--round-wait-s` the wait (0:
asynchronous at any size). Experience-only and PPO participants sync
asynchronously.

Until its learner starts (its replay holding learning_starts transitions,
the others' included), a DQN participant sharing both syncs in rounds
whatever the group's size (the plan's own rounds if it has them; else
float32 rounds of ROUND_STEPS waiting up to ROUND_WAIT_S): shared warmup,
`--no-shared-warmup` to turn it off. Steps without updates run at env
speed, far faster than the exchange, so asynchronously each member would
fill its replay by itself; in rounds a group of N fills every member's
replay in about 1/N of the steps.

Why rounds from two members (ROUNDS_FROM): averaging every round keeps a
group's models together at the price of a wait for the slowest member each
round (docs/benchmarks.md, federation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fedrl.client.federation.sync_interval import SyncInterval
from fedrl.common.group_rules import (
    ASYNC_DELTA_DTYPE,
    DELTA_DTYPES,
    ROUND_DELTA_DTYPE,
    ROUND_STEPS,
    ROUND_WAIT_S,
    GroupRules,
    Share,
)


@dataclass(frozen=True)
class SyncMode:
    """One way of syncing: its interval, wait per round (0: asynchronous) and delta type."""

    interval: SyncInterval
    round_wait_s: float
    delta_dtype: str

    def __post_init__(self) -> None:
        if self.delta_dtype not in DELTA_DTYPES:
            raise ValueError(
                f"delta dtype must be one of {', '.join(DELTA_DTYPES)}, got {self.delta_dtype!r}"
            )

    @property
    def rounds(self) -> bool:
        return self.round_wait_s > 0


@dataclass(frozen=True)
class SyncPlan:
    """How a participant syncs: `rounds` while `rounds_from` or more members push weights,
    `alone` while fewer do (or the server has not said yet); without `rounds`, `alone` at any
    size."""

    alone: SyncMode
    rounds: SyncMode | None
    rounds_from: int
    warmup: SyncMode | None = None
    """The mode until the learner starts (its replay reaches learning_starts), whatever the
    group's size; None: the plan's other modes from the first step (module docstring)."""

    @property
    def follows_the_group(self) -> bool:
        """Whether the mode depends on the group's size (else it is `alone` after any warmup)."""
        return self.rounds is not None and self.rounds != self.alone

    def with_warmup(self) -> SyncPlan:
        """This plan with rounds until the learner starts: the plan's rounds if it has them,
        else rounds of ROUND_STEPS env steps waiting up to ROUND_WAIT_S each."""
        if self.rounds is not None:
            warmup = self.rounds
        else:
            interval = SyncInterval(episodes=0, env_steps=ROUND_STEPS)
            warmup = SyncMode(interval, ROUND_WAIT_S, ROUND_DELTA_DTYPE)
        return replace(self, warmup=warmup)

    def mode(self, pushing_participants: int, *, learning: bool = True) -> SyncMode:
        """The mode while this many members push weights (0: not heard yet), before or after
        the learner starts."""
        if self.warmup is not None and not learning:
            return self.warmup
        if self.rounds is not None and pushing_participants >= self.rounds_from:
            return self.rounds
        return self.alone

    @classmethod
    def asynchronous(
        cls, *, sync_interval: int = 2, sync_steps: int = 0, delta_dtype: str = ASYNC_DELTA_DTYPE
    ) -> SyncPlan:
        """Every `sync_interval` episodes, or `sync_steps` env steps if they come first."""
        interval = SyncInterval(episodes=sync_interval, env_steps=sync_steps)
        return cls(alone=SyncMode(interval, 0.0, delta_dtype), rounds=None, rounds_from=0)

    @classmethod
    def in_rounds(
        cls, *, round_wait_s: float, sync_steps: int, delta_dtype: str = ROUND_DELTA_DTYPE
    ) -> SyncPlan:
        """Synchronous rounds of `sync_steps` env steps at any size of the group, alone too."""
        rounds = SyncMode(SyncInterval(episodes=0, env_steps=sync_steps), round_wait_s, delta_dtype)
        return cls(alone=rounds, rounds=rounds, rounds_from=1)


def effective_share(share: Share, *, on_policy: bool) -> Share:
    """What a member shares under the session's `share`: an on-policy learner (PPO) learns
    only from its own rollouts, so it shares weights whatever the session shares."""
    return "weights" if on_policy else share


def sync_plan(rules: GroupRules, *, on_policy: bool) -> SyncPlan:
    """The plan of a member following `rules`, its automatic ones resolved for its algorithm
    (module docstring); ValueError for rounds where they could not form."""
    share = effective_share(rules.share, on_policy=on_policy)
    sync_steps, delta_dtype, rounds_from = rules.sync_steps, rules.delta_dtype, rules.rounds_from
    sync_interval = rules.sync_interval
    round_wait_s = rules.round_wait_s
    if round_wait_s is None:
        # Rounds by default wherever they can form: DQN pushing weights.
        round_wait_s = ROUND_WAIT_S if share != "experience" and not on_policy else 0.0
    round_steps = ROUND_STEPS if sync_steps is None else sync_steps
    check_rounds(round_wait_s, sync_steps=round_steps, share=share, on_policy=on_policy)
    plan = SyncPlan.asynchronous(
        sync_interval=sync_interval,
        sync_steps=sync_steps or 0,
        delta_dtype=delta_dtype or ASYNC_DELTA_DTYPE,
    )
    if round_wait_s > 0:
        rounds = SyncPlan.in_rounds(
            round_wait_s=round_wait_s,
            sync_steps=round_steps,
            delta_dtype=delta_dtype or ROUND_DELTA_DTYPE,
        )
        plan = (
            rounds
            if rounds_from == 1
            else replace(rounds, alone=plan.alone, rounds_from=rounds_from)
        )
    # Weight rounds keep the members in step; experience is what fills the replays.
    if rules.shared_warmup and share == "both" and not on_policy:
        return plan.with_warmup()
    return plan


def check_rounds(round_wait_s: float, *, sync_steps: int, share: Share, on_policy: bool) -> None:
    """Refuse synchronous rounds that could not form: ValueError saying why."""
    if not (round_wait_s >= 0 and math.isfinite(round_wait_s)):
        raise ValueError(f"round wait must be a finite number of seconds >= 0, got {round_wait_s}")
    if round_wait_s == 0:
        return
    if on_policy:
        # PPO pushes after every rollout update already; whether waiting for
        # each version pays there has not been measured, so it is not offered.
        raise ValueError("synchronous rounds (--round-wait-s) are for DQN")
    if share == "experience":
        raise ValueError(
            "synchronous rounds wait for the global version holding each push: they need "
            "--share weights or both"
        )
    if sync_steps <= 0:
        raise ValueError(
            "synchronous rounds are counted in env steps, so that every member pushes at the "
            "same steps: give --sync-steps (e.g. 128) with --round-wait-s"
        )
