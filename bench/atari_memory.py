"""Bytes per Atari transition: in the replay (frames kept once) and on the wire (experience).

Transitions are the product's own: a frame actor (FrameActorCore, 16 envs
of ALE/Breakout-v5, an untrained Nature CNN acting ε-greedily) hands its
segments to a FrameReplay, as the engine does.

Replay, per million transitions stored:
- frames kept once (ours): FrameReplay's bytes over the transitions it
  holds once its ring has wrapped (frames per transition measured);
- whole stacks, uint8: a store of obs and next_obs per transition;
- whole stacks, float32: the plain replay (PrioritizedReplay) as it stores
  non-image observations.

Experience, bytes per transition of pushed batches (1,024 transitions, the
default --push-transitions): the batch the sync loop pushes (UnsentTransitions
puts its rows in chains of each env's consecutive steps, frame_replay.chain_order,
so each stack shares three frames with the row before and zstd finds them)
against its raw columns (uint8, and float32 observations), the rows in
arrival order (each actor segment's rows by env and step: chains of 8 steps),
and shuffled (nothing shared nearby). Also: what a receiver's FrameReplay
stores per pulled transition, and the time to order, encode and decode.

    .venv/bin/python bench/atari_memory.py [--quick]

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

from fedrl.client.federation.experience_sync import UnsentTransitions
from fedrl.client.training.actor import make_actor_spec
from fedrl.client.training.experience_conversion import to_experience
from fedrl.client.training.frame_actor import FrameActorCore, FrameActorSpec
from fedrl.client.training.frame_replay import FrameReplay
from fedrl.client.training.memory import stacked_bytes
from fedrl.client.training.replay import PrioritizedReplay
from fedrl.client.training.transitions import LearnerTransitions
from fedrl.common.experience import ExperienceBatch, batch_header, decode_batch, encode_batch

ENV_ID = "ALE/Breakout-v5"
ENVS = 16
PUSH = 1024
MILLION = 1_000_000


def actor() -> FrameActorCore:
    spec = make_actor_spec(
        0,
        num_actors=1,
        generation=0,
        seed_root=np.random.SeedSequence(0),
        env_id=ENV_ID,
        num_envs=ENVS,
        exploration_base=0.4,
        exploration_alpha=7.0,
        n_step=3,
        gamma=0.99,
        hidden=(),
        dueling=True,
        steps_per_slot=8,
    )
    return FrameActorCore(FrameActorSpec(spec, clip_rewards=True, episodic_life=True))


def collect(steps: int, capacity: int) -> tuple[FrameReplay, list[LearnerTransitions]]:
    """Fill a replay of `capacity` frames; the transitions of each segment as the engine
    hands them to experience exchange."""
    source = actor()
    replay = FrameReplay(capacity, (4, 84, 84), seed=0)
    batches = []
    try:
        while replay.frames_written < steps:
            slots = replay.add_frames(np.arange(ENVS), source.collect(8).segment)
            batches.append(replay.transitions(slots))
    finally:
        source.close()
    return replay, batches


def pushes(batches: list[LearnerTransitions]) -> list[LearnerTransitions]:
    """Every PUSH transitions in arrival order: what UnsentTransitions holds at a push."""
    out, pending = [], []
    for batch in batches:
        pending.append(batch)
        if sum(len(b) for b in pending) >= PUSH:
            joined = LearnerTransitions.concat(pending)
            out.append(joined.rows(np.arange(len(joined) - PUSH, len(joined))))
            pending = []
    return out


def wire(batch: LearnerTransitions) -> ExperienceBatch:
    return to_experience(batch, n_step=3, gamma=0.99, spec_hash="bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer transitions")
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps = 12_000 if args.quick else 60_000
    capacity = steps // 2  # the ring wraps: steady state

    replay, batches = collect(steps, capacity)
    frames_per_transition = capacity / len(replay)
    ours = replay.nbytes / len(replay) * MILLION
    obs_shape = (4, 84, 84)
    stacked_u8 = stacked_bytes(MILLION, obs_shape, itemsize=1)
    stacked_f32 = stacked_bytes(MILLION, obs_shape, itemsize=4)
    assert (
        stacked_bytes(100, obs_shape, itemsize=4)
        == PrioritizedReplay(100, obs_shape, seed=0).nbytes
    )

    load = os.getloadavg()[0]
    print(f"{ENV_ID}, {ENVS} envs, an untrained Nature CNN acting; load {load:.1f}")
    print("Replay, GB per million transitions")
    print(
        f"  frames kept once (ours)   {ours / 1e9:6.2f}   "
        f"({frames_per_transition:.3f} frames per transition)"
    )
    print(f"  whole stacks, uint8       {stacked_u8 / 1e9:6.2f}   ({stacked_u8 / ours:.1f}x ours)")
    print(
        f"  whole stacks, float32     {stacked_f32 / 1e9:6.2f}   ({stacked_f32 / ours:.1f}x ours)"
    )

    rng = np.random.default_rng(0)
    sizes: dict[str, list[float]] = {"ours": [], "arrival order": [], "shuffled": []}
    order_ms, encode_ms, decode_ms, stored = [], [], [], []
    raw_u8 = raw_f32 = 0.0
    for batch in pushes(batches):
        rows = len(batch)
        unsent = UnsentTransitions(PUSH, obs_shape)
        unsent.add(batch)
        start = time.perf_counter()
        taken = unsent.take()
        order_ms.append((time.perf_counter() - start) * 1e3)
        assert taken is not None
        variants = {
            "ours": taken,
            "arrival order": batch,
            "shuffled": batch.rows(rng.permutation(rows)),
        }
        for name, variant in variants.items():
            start = time.perf_counter()
            encoded = encode_batch(wire(variant))
            if name == "ours":
                encode_ms.append((time.perf_counter() - start) * 1e3)
                header = batch_header(
                    wire(variant), encoded, session="s", participant_id="p", sequence=1
                )
                start = time.perf_counter()
                decoded = decode_batch(header, encoded.block, encoded.data)
                decode_ms.append((time.perf_counter() - start) * 1e3)
                raw_u8 = encoded.block.raw_size / rows
                raw_f32 = raw_u8 + 2 * 3 * int(np.prod(obs_shape))
                receiver = FrameReplay(8 * rows, obs_shape, seed=0)
                receiver.add(
                    LearnerTransitions(
                        obs=decoded.obs,
                        action=decoded.action,
                        reward=decoded.reward,
                        next_obs=decoded.next_obs,
                        discount=decoded.discount,
                    )
                )
                stored.append(receiver.frames_written / rows)
            sizes[name].append(len(encoded.data) / rows)
    per = {name: statistics.median(values) for name, values in sizes.items()}
    print(f"Experience, bytes per transition ({len(sizes['ours'])} pushes of {PUSH}, medians)")
    print(f"  raw uint8 columns         {raw_u8:9,.0f}")
    print(f"  raw float32 observations  {raw_f32:9,.0f}")
    for name, value in per.items():
        print(f"  zstd, {name:<19} {value:9,.0f}   ({raw_u8 / value:5.1f}x smaller than raw uint8)")
    print(
        f"  per push: order {statistics.median(order_ms):.0f} ms, encode "
        f"{statistics.median(encode_ms):.0f} ms, decode {statistics.median(decode_ms):.0f} ms; "
        f"a receiver's FrameReplay stores {statistics.median(stored):.2f} frames per pulled "
        "transition"
    )
    print(
        json.dumps(
            {
                "env": ENV_ID,
                "replay_bytes_per_million": {
                    "frames_kept_once": round(ours),
                    "stacked_uint8": stacked_u8,
                    "stacked_float32": stacked_f32,
                },
                "frames_per_transition": round(frames_per_transition, 4),
                "experience_bytes_per_transition": {
                    "raw_uint8": round(raw_u8, 1),
                    "raw_float32": round(raw_f32, 1),
                    **{name: round(value, 1) for name, value in per.items()},
                },
                "order_ms": round(statistics.median(order_ms), 1),
                "encode_ms": round(statistics.median(encode_ms), 1),
                "decode_ms": round(statistics.median(decode_ms), 1),
                "receiver_frames_per_transition": round(statistics.median(stored), 3),
                "load_average": round(load, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
