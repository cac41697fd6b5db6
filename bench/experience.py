"""Bytes per transition and codec time of experience batches, ours against the alternatives.

Transitions come from real environments under a random policy (gymnasium's
CartPole-v1, and fedrl/Trading-v0 when fedrl.envs provides it), 1-step, 10k
per batch. Figures per encoding:

- raw: the columns' bytes, uncompressed (what CODEC_NONE would send);
- rows+zstd: row-interleaved records, one zstd frame (the rejected layout);
- columns+zstd, action int64: columnar, every column in its native dtype;
- columns+zstd (ours): fedrl.common.experience.encode_columns;
- columns+shuffle+zstd: ours, with float columns byte-shuffled first;
- columns, one frame: all columns back to back in one zstd frame;
- columns, next_obs|obs: ours, but next_obs compressed with obs as a zstd
  raw-content dictionary, so next_obs[i] == obs[i+1] costs a few bytes.

The last three would need a protocol extension (a tensor codec the decoder
does not know today); they are measured to decide whether one is worth it.

Compress and decompress times are per 10k transitions (median of repeats).

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
from fedrl.common.experience import ExperienceBatch, encode_columns
from fedrl.common.serde import decode_tensor

TRANSITIONS = 10_000
_ZSTD = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
_UNZSTD = zstandard.ZstdDecompressor()


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


def measure(batch: ExperienceBatch, repeats: int) -> dict[str, dict[str, float]]:
    """Bytes per transition and µs per 10k transitions of each encoding."""
    scale = 1e6 * TRANSITIONS / len(batch)
    columns = batch.columns()
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
    row_bytes = rows.tobytes()
    packed = _ZSTD.compress(row_bytes)
    results["rows+zstd"] = {
        "bytes_per_transition": len(packed) / len(batch),
        "compress_us": scale * _median_s(lambda: _ZSTD.compress(rows.tobytes()), repeats),
        "decompress_us": scale
        * _median_s(lambda: np.frombuffer(_UNZSTD.decompress(packed), dtype=record), repeats),
    }

    native = [(name, _ZSTD.compress(column.tobytes())) for name, column in columns]
    results["columns+zstd, action int64"] = {
        "bytes_per_transition": sum(len(d) for _, d in native) / len(batch),
        "compress_us": scale
        * _median_s(lambda: [_ZSTD.compress(c.tobytes()) for _, c in columns], repeats),
        "decompress_us": scale
        * _median_s(lambda: [_UNZSTD.decompress(d) for _, d in native], repeats),
    }

    ours = encode_columns(batch)
    results["columns+zstd (ours)"] = {
        "bytes_per_transition": sum(h.encoded_size for h, _ in ours) / len(batch),
        "compress_us": scale * _median_s(lambda: encode_columns(batch), repeats),
        "decompress_us": scale
        * _median_s(
            lambda: [decode_tensor(h, d, max_raw_bytes=h.raw_size) for h, d in ours], repeats
        ),
    }

    def shuffled_encode() -> list[bytes]:
        return [
            _ZSTD.compress(_shuffle(c) if c.dtype.kind == "f" else c.tobytes())
            for c in _wire_columns(batch)
        ]

    shuffled = shuffled_encode()
    results["columns+shuffle+zstd"] = {
        "bytes_per_transition": sum(len(d) for d in shuffled) / len(batch),
        "compress_us": scale * _median_s(shuffled_encode, repeats),
        "decompress_us": scale
        * _median_s(
            lambda: [
                _unshuffle(_UNZSTD.decompress(d), c.dtype, c.shape)
                if c.dtype.kind == "f"
                else _UNZSTD.decompress(d)
                for d, c in zip(shuffled, _wire_columns(batch), strict=True)
            ],
            repeats,
        ),
    }
    wire = _wire_columns(batch)
    block = b"".join(column.tobytes() for column in wire)
    framed = _ZSTD.compress(block)
    results["columns, one frame"] = {
        "bytes_per_transition": len(framed) / len(batch),
        "compress_us": scale
        * _median_s(lambda: _ZSTD.compress(b"".join(c.tobytes() for c in wire)), repeats),
        "decompress_us": scale * _median_s(lambda: _UNZSTD.decompress(framed), repeats),
    }

    def prefixed_encode() -> list[bytes]:
        prefix = zstandard.ZstdCompressionDict(
            batch.obs.tobytes(), dict_type=zstandard.DICT_TYPE_RAWCONTENT
        )
        with_prefix = zstandard.ZstdCompressor(level=ZSTD_LEVEL, dict_data=prefix)
        return [
            with_prefix.compress(c.tobytes()) if name == "next_obs" else _ZSTD.compress(c.tobytes())
            for (name, _), c in zip(columns, wire, strict=True)
        ]

    def prefixed_decode(encoded: list[bytes]) -> None:
        obs = _UNZSTD.decompress(encoded[0])
        prefix = zstandard.ZstdCompressionDict(obs, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        for (name, _), data in zip(columns, encoded, strict=True):
            if name == "next_obs":
                zstandard.ZstdDecompressor(dict_data=prefix).decompress(data)
            elif name != "obs":
                _UNZSTD.decompress(data)

    prefixed = prefixed_encode()
    results["columns, next_obs|obs"] = {
        "bytes_per_transition": sum(len(d) for d in prefixed) / len(batch),
        "compress_us": scale * _median_s(prefixed_encode, repeats),
        "decompress_us": scale * _median_s(lambda: prefixed_decode(prefixed), repeats),
    }
    for figures in results.values():
        figures["ratio_vs_raw"] = (
            results["raw"]["bytes_per_transition"] / figures["bytes_per_transition"]
        )
    return results


def _wire_columns(batch: ExperienceBatch) -> list[np.ndarray]:
    """The columns as encode_columns sends them (action narrowed)."""
    return [
        column.astype(np.uint8) if name == "action" else column for name, column in batch.columns()
    ]


def _print(env_id: str, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{env_id}: {TRANSITIONS} transitions, 1-step, random policy")
    print(
        f"{'encoding':<30}{'B/transition':>14}{'ratio':>8}{'compress µs':>14}{'decompress µs':>15}"
    )
    for name, f in results.items():
        print(
            f"{name:<30}{f['bytes_per_transition']:>14.2f}{f['ratio_vs_raw']:>8.2f}"
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
    print(
        json.dumps(
            {
                "bench": "experience",
                "quick": args.quick,
                "transitions": TRANSITIONS,
                "figures": figures,
            }
        )
    )


if __name__ == "__main__":
    main()
