"""Bytes and time per push: a real DQN delta encoded as the sync loop sends it.

Trains the default CartPole learner (256x256 dueling MLP) serially for a
while, takes the delta between two syncs the way the sync loop does
(local − reference), and encodes it in each wire dtype with zstd, next to
the baseline of raw float32 (what a naive pickle-free sender would ship).
Prints bytes, compression ratio, encode and decode time, and the error the
half-precision types add relative to the delta's own scale.

Usage: .venv/bin/python bench/sync_payload.py [--quick]
The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from fedrl.client.federation.federation_client import build_update
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.common.chunking import DecodeLimits, assemble
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import tensor_pb2 as tpb

DTYPES = {
    "float32": tpb.DTYPE_FLOAT32,
    "float16": tpb.DTYPE_FLOAT16,
    "bfloat16": tpb.DTYPE_BFLOAT16,
}


def real_delta(episodes: int) -> list[tuple[str, np.ndarray]]:
    """local − reference across `episodes` episodes of training after warm-up."""
    learner = LearnerConfig(learning_starts=500, device="cpu")
    with TrainingEngine(EngineConfig(workers=0, eval_interval=0), learner) as engine:
        while engine.counters.episodes < 50:
            engine.poll()
        reference = engine.weights()
        start = engine.counters.episodes
        while engine.counters.episodes < start + episodes:
            engine.poll()
        local = engine.weights()
    return [(n, w - r) for (n, w), (_, r) in zip(local, reference, strict=True)]


def measure(delta: list[tuple[str, np.ndarray]], dtype: int, repeats: int) -> dict[str, float]:
    encode_s = decode_s = 0.0
    for _ in range(repeats):
        began = time.perf_counter()
        messages = build_update(
            session="bench",
            participant_id="bench",
            sequence=1,
            base_version=0,
            env_steps=1,
            episodes=1,
            samples=1,
            metrics=pb.UpdateMetrics(),
            spec_hash="0" * 64,
            delta=delta,
            dtype=dtype,
        )
        encoded = [m.SerializeToString() for m in messages]
        encode_s += time.perf_counter() - began
        began = time.perf_counter()
        parsed = [pb.UpdateChunk.FromString(m) for m in encoded]
        decoded = assemble(
            parsed[0].header.tensors,
            [m.chunk for m in parsed[1:]],
            DecodeLimits(),
        )
        decode_s += time.perf_counter() - began
    scale = max(float(np.abs(d).max()) for _, d in delta) or 1.0
    error = max(
        float(np.abs(got - want).max()) for (_, got), (_, want) in zip(decoded, delta, strict=True)
    )
    return {
        "bytes": sum(len(m) for m in encoded),
        "encode_ms": 1000 * encode_s / repeats,
        "decode_ms": 1000 * decode_s / repeats,
        "max_error_rel": error / scale,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short training stretch")
    args = parser.parse_args()
    episodes, repeats = (10, 3) if args.quick else (40, 10)

    delta = real_delta(episodes)
    raw = sum(d.nbytes for _, d in delta)
    results = {name: measure(delta, code, repeats) for name, code in DTYPES.items()}

    print(f"delta of {sum(d.size for _, d in delta):,} parameters after {episodes} episodes")
    print(
        f"{'encoding':<22}{'bytes':>12}{'vs raw f32':>12}{'encode ms':>11}{'decode ms':>11}"
        f"{'max rel err':>13}"
    )
    print(f"{'raw float32 (baseline)':<22}{raw:>12,}{1.0:>12.2f}{'-':>11}{'-':>11}{0.0:>13.1e}")
    for name, r in results.items():
        print(
            f"{name + ' + zstd':<22}{int(r['bytes']):>12,}{raw / r['bytes']:>12.2f}"
            f"{r['encode_ms']:>11.2f}{r['decode_ms']:>11.2f}{r['max_error_rel']:>13.1e}"
        )
    print(json.dumps({"raw_float32_bytes": raw, "episodes": episodes, **results}))


if __name__ == "__main__":
    main()
