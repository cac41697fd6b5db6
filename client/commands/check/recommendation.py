"""Settings to train with, from the check's measurements; each comes with its reason.

- envs per actor: the smallest width that reaches 90 % of the best measured
  actor throughput. Each vector step pays one inference call whose fixed cost
  (tens of µs) more envs share; past the knee, more envs only stale the
  weights an actor acts with and cost memory.
- actors: the smallest count within 90 % of the best measured aggregate rate,
  at most cores − 1 (the learner keeps one core). One core: serial mode (0).
- device: CUDA when present and faster per update than the CPU.
- batch size (DQN): the largest measured batch whose update rate still keeps
  up with the actors at the engine's replay ratio; a larger batch averages
  more samples per step for the same number of steps.
- minibatch size (PPO, `--algo ppo`): the largest measured minibatch whose
  gradient steps run within 10 % as fast as the default's (256): where the
  device computes a larger minibatch in about the same time (a GPU), it
  averages more samples per step at no cost; where it does not (a CPU),
  fewer, larger steps learn less per env step.
- rollout length (PPO): steps per env so that one update learns from two
  minibatches' worth of samples across all actors' envs, as the defaults do
  (16 envs × 32 steps = 2 × 256).
- replay capacity (DQN on games): the most frames, up to 1M, whose replay
  takes at most half of the memory available now (fedrl.client.training.memory);
  each frame is kept once, about one per transition. Games are probed with
  their own settings (fedrl.client.commands.game_defaults), e.g. one update
  per 4 env steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from fedrl.client.commands.check.env_probes import WidthProbe
from fedrl.client.commands.check.learner_probes import UpdateProbe
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.memory import available_bytes, fitting_capacity, replay_bytes
from fedrl.client.training.ppo_learner import PPOConfig

MINIBATCHES_PER_UPDATE = 2
"""Samples per PPO update, in minibatches: what the defaults give (16 envs × 32 steps, 256)."""
MIN_ROLLOUT_STEPS = 8
"""Fewer steps per env and rollout leave GAE almost no steps to look ahead over."""
KNEE = 0.9
"""Share of the best measured rate that counts as "as good": below 10 % the
difference is inside the noise of a busy machine, and the cheaper setting wins."""


@dataclass(frozen=True)
class Recommendation:
    workers: int
    envs_per_worker: int
    batch_size: int
    """DQN: samples per update; PPO: the minibatch size."""
    device: str
    reasons: tuple[str, ...]
    rollout_steps: int | None = None
    """PPO only: steps per env and rollout."""
    replay_capacity: int | None = None
    """DQN on games: frames the replay holds."""
    env: str = ""
    """The env the recommendation is for, named in the command where it is not the default."""

    def command(self) -> str:
        env = f" --env {self.env}" if self.env and self.env != EngineConfig().env else ""
        collection = f"--workers {self.workers} --envs-per-worker {self.envs_per_worker}"
        if self.rollout_steps is not None:
            return (
                f"fedrl-client --algo ppo{env} {collection} --rollout-steps {self.rollout_steps} "
                f"--minibatch-size {self.batch_size} --device {self.device}"
            )
        capacity = (
            f" --replay-capacity {self.replay_capacity}" if self.replay_capacity is not None else ""
        )
        return (
            f"fedrl-client{env} {collection} --batch-size {self.batch_size}{capacity} "
            f"--device {self.device}"
        )


def knee(rates: dict[int, float]) -> int:
    """The smallest setting within KNEE of the best."""
    best = max(rates.values())
    return min(k for k, rate in rates.items() if rate >= KNEE * best)


def recommend(
    cores: int,
    widths: Sequence[WidthProbe],
    workers: dict[int, float],
    updates: Sequence[UpdateProbe],
    replay_ratio: float,
) -> Recommendation:
    """Settings from the measurements; each comes with the reason, in numbers."""
    width = knee({p.envs: p.actor_steps_per_s for p in widths})
    chosen = next(p for p in widths if p.envs == width)
    reasons = [
        f"envs per worker {width}: {chosen.actor_steps_per_s:,.0f} steps/s per actor, within "
        f"{1 - KNEE:.0%} of the best width measured; inference costs {chosen.inference_us:.0f} µs "
        "per vector step"
    ]

    # Collection: as many actors as still add speed, one core left to the learner.
    if cores <= 1:
        count, collect = 0, chosen.actor_steps_per_s
        workers_reason = "workers 0 (serial): one usable core, shared by actor and learner"
    elif not workers:
        count, collect = cores - 1, (cores - 1) * chosen.actor_steps_per_s
        workers_reason = (
            f"workers {count}: cores − 1, one core stays with the learner (parallel actors not "
            f"measured; {collect:,.0f} env steps/s estimated from one actor)"
        )
    else:
        count = knee(workers)
        collect = workers[count]
        measured = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(workers.items()))
        workers_reason = (
            f"workers {count}: {collect:,.0f} env steps/s together (measured {measured}); "
            "one core stays with the learner"
        )

    # Learning: the device faster at the default batch of 64, then the largest
    # batch whose update rate still keeps up with collection.
    by_device: dict[str, list[UpdateProbe]] = {}
    for probe in updates:
        by_device.setdefault(probe.device, []).append(probe)
    device = max(
        by_device,
        key=lambda d: min(by_device[d], key=lambda p: abs(p.batch_size - 64)).updates_per_s,
    )
    device_reason = (
        f"device {device}: the faster update of those measured"
        if len(by_device) > 1
        else f"device {device}: no CUDA device here"
    )
    needed = replay_ratio * collect
    probes = sorted(by_device[device], key=lambda p: p.batch_size)
    keeping_up = [p for p in probes if p.updates_per_s >= needed]
    if keeping_up:
        pick = keeping_up[-1]
        batch_reason = (
            f"batch size {pick.batch_size}: {pick.updates_per_s:,.0f} updates/s keeps up with "
            f"the {needed:,.0f} needed (replay ratio {replay_ratio} × {collect:,.0f} steps/s)"
        )
    else:
        pick = max(probes, key=lambda p: p.updates_per_s)
        consumed = pick.updates_per_s / replay_ratio
        batch_reason = (
            f"batch size {pick.batch_size}: the fastest update measured, "
            f"{pick.updates_per_s:,.0f}/s, and still the learner sets the pace: it consumes "
            f"{consumed:,.0f} env steps/s at replay ratio {replay_ratio}, the actors make "
            f"{collect:,.0f}; the engine holds them back"
        )
        # Actors beyond what the learner consumes only wait, holding cores and memory.
        enough = [k for k, rate in sorted(workers.items()) if rate >= consumed]
        if workers and count > (fewer := enough[0] if enough else min(workers)):
            count = fewer
            workers_reason = (
                f"workers {count}: enough for the {consumed:,.0f} env steps/s the learner "
                f"consumes (measured {workers[count]:,.0f})"
            )
    reasons += [workers_reason, device_reason, batch_reason]
    return Recommendation(count, width, pick.batch_size, device, tuple(reasons))


def recommend_ppo(
    cores: int,
    widths: Sequence[WidthProbe],
    workers: dict[int, float],
    updates: Sequence[UpdateProbe],
) -> Recommendation:
    """PPO's settings from the measurements: collection as for DQN, then minibatch and rollout."""
    collection = recommend(cores, widths, workers, updates, replay_ratio=1.0)
    by_device: dict[str, dict[int, float]] = {}
    for probe in updates:
        by_device.setdefault(probe.device, {})[probe.batch_size] = probe.updates_per_s
    base = PPOConfig().minibatch_size

    def rate_at_base(device: str) -> float:
        return by_device[device].get(base, max(by_device[device].values()))

    device = max(by_device, key=rate_at_base)
    rates = by_device[device]
    reference = rate_at_base(device)
    minibatch = max(
        (size for size, rate in rates.items() if rate >= KNEE * reference and size >= base),
        default=base,
    )
    measured = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(rates.items()))
    minibatch_reason = (
        f"minibatch size {minibatch}: {rates.get(minibatch, reference):,.0f} gradient steps/s "
        f"on {device}, within {1 - KNEE:.0%} of the {reference:,.0f}/s at {base} "
        f"(measured {measured})"
        if minibatch != base
        else f"minibatch size {base}: larger ones take longer per gradient step on {device} "
        f"(gradient steps/s measured {measured})"
    )
    envs = max(1, collection.workers) * collection.envs_per_worker
    needed = -(-MINIBATCHES_PER_UPDATE * minibatch // envs)
    rollout = max(MIN_ROLLOUT_STEPS, needed)
    rollout_reason = (
        f"rollout steps {rollout}: {envs} envs × {rollout} steps = {envs * rollout:,} samples per "
        f"update, {MINIBATCHES_PER_UPDATE} minibatches of {minibatch}"
        + (
            f" or more (at least {MIN_ROLLOUT_STEPS} steps: GAE needs a horizon)"
            if needed < MIN_ROLLOUT_STEPS
            else ""
        )
    )
    device_reason = (
        f"device {device}: the faster gradient step of those measured"
        if len(by_device) > 1
        else f"device {device}: no CUDA device here"
    )
    collect_reasons = collection.reasons[:2]
    if collection.workers == 1:
        collect_reasons = (
            collect_reasons[0],
            "workers 1: one actor, which PPO runs in the learner's process (collection and "
            "learning take turns, so a process of its own would overlap with nothing)",
        )
    return Recommendation(
        collection.workers,
        collection.envs_per_worker,
        minibatch,
        device,
        (*collect_reasons, device_reason, minibatch_reason, rollout_reason),
        rollout_steps=rollout,
    )


def with_capacity(recommendation: Recommendation, obs_shape: tuple[int, ...]) -> Recommendation:
    """The recommendation with the replay capacity that fits the memory available now."""
    available = available_bytes()
    capacity = fitting_capacity(obs_shape, available=available)
    size = replay_bytes(capacity, obs_shape)
    reason = (
        f"replay capacity {capacity:,}: {size / 1e9:.1f} GB with each frame kept once, at most "
        f"half of the {available / 1e9:.1f} GB available (up to the 1M transitions of the "
        "Nature DQN)"
    )
    return dataclasses.replace(
        recommendation,
        replay_capacity=capacity,
        reasons=(*recommendation.reasons, reason),
    )
