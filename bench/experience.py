"""Bytes per transition and codec time of experience batches, ours against the alternatives.

Transitions come from real environments under a random policy (gymnasium's
CartPole-v1, and fedrl/Trading-v0 when fedrl.envs provides it), 1-step, 10k
per batch. Figures per encoding:

- raw: the columns' bytes as a batch holds them (actions int64), uncompressed;
- rows+zstd: row-interleaved records, one zstd frame (the rejected layout);
- per column (baseline): each column its own zstd frame, actions narrowed to
  uint8 (the previous wire format, rebuilt here from serde's encode_tensor);
- one frame (ours): fedrl.common.experience.encode_batch / decode_batch, all
  columns back to back in one zstd frame, with every decoder check;
- one frame, shuffled floats: ours with float columns byte-shuffled before
  compression (would need a new codec: measured to decide whether to add one).

Compress and decompress times are per 10k transitions (median of repeats);
ours are the real encode and decode calls, everything else is bare zstd.
Target (issue #6): >= 2.5x smaller than raw on CartPole at < 1 ms per 10k.

    .venv/bin/python bench/experience.py [--quick]

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import zstandard

from fedrl.common.codecs import ZSTD_LEVEL
from fedrl.common.experience import (
    WINDOW_LOG,
    ExperienceBatch,
    batch_header,
    decode_batch,
    encode_batch,
)
from fedrl.common.serde import decode_tensor, encode_tensor
from fedrl.proto.v1 import tensor_pb2 as tpb

TRANSITIONS = 10_000
TARGET_RATIO = 2.5
TARGET_COMPRESS_US = 1000.0
_ZSTD = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
_UNZSTD = zstandard.ZstdDecompressor()
# Ours compresses with a wider window; the shuffled variant gets the same one.
_ZSTD_WIDE = zstandard.ZstdCompressor(
    compression_params=zstandard.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL, window_log=WINDOW_LOG
    )
)


def collect(env_id: str, count: int, seed: int = 0) -> ExperienceBatch:
    """count 1-step transitions of a random policy, episodes back to back."""
    env = gym.make(env_id)
    actions = env.action_space
    assert isinstance(actions, gym.spaces.Discrete), f"{env_id} has no discrete action space"
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    rows: dict[str, list[object]] = {
        k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")
    }
    while len(rows["obs"]) < count:
        action = int(rng.integers(actions.n))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(
            rows, (obs, action, reward, next_obs, terminated, truncated), strict=True
        ):
            rows[key].append(value)
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    gamma = 0.99
    terminated_column = np.asarray(rows["terminated"], dtype=bool)
    return ExperienceBatch(
        obs=np.asarray(rows["obs"], dtype=np.float32),
        action=np.asarray(rows["action"], dtype=np.int64),
        reward=np.asarray(rows["reward"], dtype=np.float32),
        next_obs=np.asarray(rows["next_obs"], dtype=np.float32),
        discount=np.where(terminated_column, 0.0, gamma).astype(np.float32),
        terminated=terminated_column,
        truncated=np.asarray(rows["truncated"], dtype=bool),
        n_step=1,
        gamma=gamma,
        env_spec_hash="0" * 64,
    )


def _median_s(call: Callable[[], object], repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _shuffle(column: np.ndarray) -> bytes:
    """Byte-shuffle: all first bytes of every element, then all second bytes, ..."""
    flat = np.ascontiguousarray(column).reshape(-1)
    return flat.view(np.uint8).reshape(-1, flat.itemsize).T.tobytes()


def _unshuffle(data: bytes, dtype: np.dtype[np.generic], shape: tuple[int, ...]) -> np.ndarray:
    planes = np.frombuffer(data, dtype=np.uint8).reshape(dtype.itemsize, -1)
    return np.ascontiguousarray(planes.T).view(dtype).reshape(shape)


def _wire_columns(batch: ExperienceBatch) -> list[tuple[str, np.ndarray]]:
    """The columns in wire order as they travel (actions narrowed to uint8)."""
    return [
        (name, column.astype(np.uint8) if name == "action" else column)
        for name, column in batch.columns()
    ]


def measure(batch: ExperienceBatch, repeats: int) -> dict[str, dict[str, float]]:
    """Bytes per transition and µs per 10k transitions of each encoding."""
    scale = 1e6 * TRANSITIONS / len(batch)
    columns = batch.columns()
    wire = _wire_columns(batch)
    raw_bytes = sum(column.nbytes for _, column in columns)
    results: dict[str, dict[str, float]] = {
        "raw": {
            "bytes_per_transition": raw_bytes / len(batch),
            "compress_us": 0.0,
            "decompress_us": 0.0,
        }
    }

    # Row-interleaved: one structured record per transition.
    record = np.dtype([(name, column.dtype, column.shape[1:]) for name, column in columns])
    rows = np.empty(len(batch), dtype=record)
    for name, column in columns:
        rows[name] = column
    packed = _ZSTD.compress(rows.tobytes())
    results["rows+zstd"] = {
        "bytes_per_transition": len(packed) / len(batch),
        "compress_us": scale * _median_s(lambda: _ZSTD.compress(rows.tobytes()), repeats),
        "decompress_us": scale
        * _median_s(lambda: np.frombuffer(_UNZSTD.decompress(packed), dtype=record), repeats),
    }

    def per_column_encode() -> list[tuple[tpb.TensorHeader, bytes]]:
        return [encode_tensor(name, column) for name, column in wire]

    per_column = per_column_encode()
    results["per column (baseline)"] = {
        "bytes_per_transition": sum(h.encoded_size for h, _ in per_column) / len(batch),
        "compress_us": scale * _median_s(per_column_encode, repeats),
        "decompress_us": scale
        * _median_s(
            lambda: [decode_tensor(h, d, max_raw_bytes=h.raw_size) for h, d in per_column],
            repeats,
        ),
    }

    ours = encode_batch(batch)
    header = batch_header(batch, ours, session="bench", participant_id="bench", sequence=1)
    results["one frame (ours)"] = {
        "bytes_per_transition": ours.block.encoded_size / len(batch),
        "compress_us": scale * _median_s(lambda: encode_batch(batch), repeats),
        "decompress_us": scale
        * _median_s(lambda: decode_batch(header, ours.block, ours.data), repeats),
    }

    def shuffled_encode() -> bytes:
        return _ZSTD_WIDE.compress(
            b"".join(_shuffle(c) if c.dtype.kind == "f" else c.tobytes() for _, c in wire)
        )

    def shuffled_decode(data: bytes) -> list[np.ndarray]:
        block, offset, decoded = _UNZSTD.decompress(data), 0, []
        for _, column in wire:
            piece = block[offset : offset + column.nbytes]
            offset += column.nbytes
            if column.dtype.kind == "f":
                decoded.append(_unshuffle(piece, column.dtype, column.shape))
            else:
                decoded.append(np.frombuffer(piece, dtype=column.dtype).reshape(column.shape))
        return decoded

    shuffled = shuffled_encode()
    results["one frame, shuffled floats"] = {
        "bytes_per_transition": len(shuffled) / len(batch),
        "compress_us": scale * _median_s(shuffled_encode, repeats),
        "decompress_us": scale * _median_s(lambda: shuffled_decode(shuffled), repeats),
    }
    for figures in results.values():
        figures["ratio_vs_raw"] = (
            results["raw"]["bytes_per_transition"] / figures["bytes_per_transition"]
        )
    return results


def _print(env_id: str, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{env_id}: {TRANSITIONS} transitions, 1-step, random policy")
    print(
        f"{'encoding':<28}{'B/transition':>14}{'ratio':>8}{'compress µs':>14}{'decompress µs':>15}"
    )
    for name, f in results.items():
        print(
            f"{name:<28}{f['bytes_per_transition']:>14.2f}{f['ratio_vs_raw']:>8.2f}"
            f"{f['compress_us']:>14.0f}{f['decompress_us']:>15.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timing repeats")
    args = parser.parse_args()
    repeats = 5 if args.quick else 50

    envs = ["CartPole-v1"]
    if importlib.util.find_spec("fedrl.envs.trading") is not None:
        import fedrl.envs  # noqa: F401, PLC0415  (registers fedrl/Trading-v0)
        from fedrl.envs import ENV_ID  # noqa: PLC0415

        envs.append(ENV_ID)
    else:
        print("fedrl.envs.trading is absent: the trading environment is skipped")

    figures = {}
    for env_id in envs:
        figures[env_id] = measure(collect(env_id, TRANSITIONS), repeats)
        _print(env_id, figures[env_id])

    ours = figures["CartPole-v1"]["one frame (ours)"]
    baseline = figures["CartPole-v1"]["per column (baseline)"]
    met = ours["ratio_vs_raw"] >= TARGET_RATIO and ours["compress_us"] < TARGET_COMPRESS_US
    print(
        f"\nCartPole target x{TARGET_RATIO} at < {TARGET_COMPRESS_US:.0f} µs per 10k: "
        f"ours x{ours['ratio_vs_raw']:.2f} at {ours['compress_us']:.0f} µs "
        f"(baseline x{baseline['ratio_vs_raw']:.2f} at {baseline['compress_us']:.0f} µs): "
        f"{'met' if met else 'NOT met'}"
    )
    print(
        json.dumps(
            {
                "bench": "experience",
                "quick": args.quick,
                "transitions": TRANSITIONS,
                "target": {
                    "env": "CartPole-v1",
                    "min_ratio": TARGET_RATIO,
                    "max_compress_us": TARGET_COMPRESS_US,
                    "met": met,
                },
                "figures": figures,
            }
        )
    )


if __name__ == "__main__":
    main()
