"""Aggregation server throughput under N participants, beside Flower's FedAvg round time.

fedrl: a real `fedrl-server` process on 127.0.0.1; N participant processes
push 1M-parameter bfloat16 deltas as fast as the server answers, for a fixed
time. Figures: updates applied per second (acked updates folded into a
committed version within the window), push latency p50/p99 (header to ack,
client side), versions created, the server's peak RSS.

Flower: the same model size and client count under flwr's FedAvg
(start_server / start_client, one process each); round time from
configure_fit to the end of aggregate_fit, on the server. One Flower round
costs every client one update, so its cost per client update is round time /
N; ours is 1 / (updates applied per second).

    .venv/bin/python bench/server.py [--quick]

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import socket
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil

from fedrl.common.chunking import chunk_tensors
from fedrl.common.identity import id_to_metadata
from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.launcher import ServerProcess

SHAPE = (1000, 1000)
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
]
TARGET_UPDATES_PER_S = 40.0
TARGET_P99_MS = 250.0


@dataclass(frozen=True)
class BenchConfig:
    """What one run measures."""

    participants: int
    """Participant processes pushing at once."""
    duration_s: float
    """Length of the measured window."""
    buffer_size: int
    """Server's K: updates per new version."""
    flower_rounds: int
    """FedAvg rounds timed (after one warm-up round)."""


def spec() -> tpb.ModelSpec:
    return tpb.ModelSpec(
        tensors=[tpb.TensorSpec(name="w", dtype=tpb.DTYPE_FLOAT32, shape=list(SHAPE))],
        env_id="bench",
        algorithm="bench/1m",
    )


# fedrl -----------------------------------------------------------------------


@contextlib.contextmanager
def fedrl_server(data_dir: Path, buffer_size: int) -> Iterator[tuple[str, psutil.Process]]:
    server = ServerProcess(
        data_dir,
        "--buffer-size",
        str(buffer_size),
        "--buffer-timeout-s",
        "0.5",
        # The per-participant push rate limit guards a shared server against a
        # runaway client; this bench measures what the server can take, so
        # every participant pushes as fast as it is answered.
        "--push-rate-per-s",
        "1000",
        "--push-burst",
        "1000",
        # Benchmarks measure training, not the page.
        "--no-dashboard",
    )
    server.start()
    try:
        yield server.address, psutil.Process(server.pid)
    finally:
        server.stop(grace_s=120)


@dataclass(frozen=True)
class Signals:
    """How the parent and the participant processes talk (multiprocessing objects)."""

    ready: Any
    """Queue: each participant puts its index once joined and ready to push."""
    go: Any
    """Event: set by the parent when all are ready; the window starts."""
    results: Any
    """Queue: each participant's (latencies, refused) at the end."""


def participant(index: int, address: str, duration_s: float, signals: Signals) -> None:
    """Push the same delta (fresh header each time) for duration_s after `go`; report latencies."""
    pid = f"p{index}"
    model = spec()
    digest = spec_hash(model)
    rng = np.random.default_rng(index)
    delta = (rng.standard_normal(SHAPE) * 1e-3).astype(np.float32)
    # Encoded once: the figure is the server's cost, not the client's encoder.
    list_header, chunks = chunk_tensors([("w", delta)], dtype=tpb.DTYPE_BFLOAT16)
    body = [pb.UpdateChunk(chunk=c) for c in chunks]
    metadata = [id_to_metadata(pid)]
    latencies: list[float] = []
    refused = 0
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
        joined = stub.Join(
            pb.JoinRequest(session="bench", participant_id=pid, spec=model, spec_hash=digest),
            metadata=metadata,
        )
        base, sequence = joined.current_version, joined.last_update_sequence + 1
        # Start together, once every process has imported, encoded and joined.
        signals.ready.put(index)
        signals.go.wait()
        stop_at = time.time() + duration_s
        while time.time() < stop_at:
            header = pb.UpdateHeader(
                session="bench",
                participant_id=pid,
                sequence=sequence,
                base_version=base,
                episodes=1,
                env_steps=1000,
                samples=1000,
                spec_hash=digest,
                tensors=list_header,
            )
            began = time.perf_counter()
            try:
                reply = stub.PushUpdate(
                    iter([pb.UpdateChunk(header=header), *body]), metadata=metadata, timeout=30
                )
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                refused += 1
                base = stub.GetVersion(pb.GetVersionRequest(session="bench")).current_version
            else:
                latencies.append(time.perf_counter() - began)
                base = reply.current_version
            sequence += 1
    signals.results.put((latencies, refused))


def seed_session(address: str) -> None:
    model = spec()
    metadata = [id_to_metadata("p0")]
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
        stub.Join(
            pb.JoinRequest(
                session="bench", participant_id="p0", spec=model, spec_hash=spec_hash(model)
            ),
            metadata=metadata,
        )
        weights = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
        list_header, chunks = chunk_tensors([("w", weights)])
        header = pb.ModelUploadHeader(
            session="bench", participant_id="p0", spec_hash=spec_hash(model), tensors=list_header
        )
        messages = [pb.ModelUpload(header=header), *(pb.ModelUpload(chunk=c) for c in chunks)]
        stub.SeedModel(iter(messages), metadata=metadata)


def peak_rss(process: psutil.Process, stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.2):
        with contextlib.suppress(psutil.Error):
            peak[0] = max(peak[0], process.memory_info().rss)


def run_fedrl(config: BenchConfig) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fedrl-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        with fedrl_server(data_dir, config.buffer_size) as (address, server):
            seed_session(address)
            context = mp.get_context("spawn")
            signals = Signals(context.Queue(), context.Event(), context.Queue())
            workers = [
                context.Process(target=participant, args=(i, address, config.duration_s, signals))
                for i in range(config.participants)
            ]
            for worker in workers:
                worker.start()
            for _ in workers:
                signals.ready.get(timeout=300)
            cpu_before = cpu_seconds(server)
            load_before = os.getloadavg()[0]
            start_at = time.time()
            signals.go.set()
            stop_at = start_at + config.duration_s
            stop, peak = threading.Event(), [server.memory_info().rss]
            sampler = threading.Thread(target=peak_rss, args=(server, stop, peak), daemon=True)
            sampler.start()
            outcomes = [signals.results.get(timeout=config.duration_s + 120) for _ in workers]
            # The window's CPU: on a shared machine, time per update varies with
            # the load while CPU per update does not.
            server_cpu_s = cpu_seconds(server) - cpu_before
            load_after = os.getloadavg()[0]
            for worker in workers:
                worker.join()
            stop.set()
            sampler.join()
        applied, versions = count_applied(data_dir, start_at, stop_at)
    latencies = np.array([x for lat, _ in outcomes for x in lat]) * 1000
    return {
        "participants": config.participants,
        "parameters": int(np.prod(SHAPE)),
        "duration_s": config.duration_s,
        "buffer_size": config.buffer_size,
        "updates_acked": int(latencies.size),
        "updates_refused_stale": sum(refused for _, refused in outcomes),
        "updates_applied": applied,
        "updates_applied_per_s": applied / config.duration_s,
        "versions_created": versions,
        "push_latency_p50_ms": float(np.percentile(latencies, 50)),
        "push_latency_p99_ms": float(np.percentile(latencies, 99)),
        "server_peak_rss_mb": peak[0] / 2**20,
        "cost_per_applied_update_ms": 1000 * config.duration_s / max(applied, 1),
        "server_cpu_per_applied_update_ms": 1000 * server_cpu_s / max(applied, 1),
        "load_average_1min": [load_before, load_after],
    }


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU time of the process and its threads so far."""
    times = process.cpu_times()
    return float(times.user + times.system)


def count_applied(data_dir: Path, start_at: float, stop_at: float) -> tuple[int, int]:
    """Updates folded into versions committed inside the window, and those versions."""
    window = (int(start_at * 1000), int(stop_at * 1000))
    with sqlite3.connect(data_dir / "state.sqlite3") as db:
        versions = [
            v
            for (v,) in db.execute(
                "SELECT version FROM versions WHERE version > 0 AND created_ms BETWEEN ? AND ?",
                window,
            )
        ]
        applied = db.execute(
            "SELECT COUNT(*) FROM acks WHERE applied_version IN "
            f"({','.join('?' * len(versions)) or 'NULL'})",
            versions,
        ).fetchone()[0]
    return int(applied), len(versions)


# Flower ----------------------------------------------------------------------


def flower_server(port: int, config: BenchConfig, out: Any) -> None:
    import flwr  # noqa: PLC0415  (bench-only dependency)
    from flwr.server.strategy import FedAvg  # noqa: PLC0415

    rounds: list[float] = []

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round: int, *args: Any, **kwargs: Any) -> Any:
            self._began = time.perf_counter()
            return super().configure_fit(server_round, *args, **kwargs)

        def aggregate_fit(self, server_round: int, *args: Any, **kwargs: Any) -> Any:
            result = super().aggregate_fit(server_round, *args, **kwargs)
            rounds.append(time.perf_counter() - self._began)
            return result

    weights = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    strategy = TimedFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=config.participants,
        min_available_clients=config.participants,
        initial_parameters=flwr.common.ndarrays_to_parameters([weights]),
    )
    flwr.server.start_server(
        server_address=f"127.0.0.1:{port}",
        config=flwr.server.ServerConfig(num_rounds=config.flower_rounds + 1),
        strategy=strategy,
    )
    out.put(rounds)


def flower_client(index: int, port: int) -> None:
    import flwr  # noqa: PLC0415

    rng = np.random.default_rng(index)
    delta = (rng.standard_normal(SHAPE) * 1e-3).astype(np.float32)

    class Client(flwr.client.NumPyClient):
        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> Any:
            return [parameters[0] + delta], 1000, {}

    flwr.client.start_client(server_address=f"127.0.0.1:{port}", client=Client().to_client())


def run_flower(config: BenchConfig) -> dict[str, Any]:
    try:
        import flwr  # noqa: F401, PLC0415
    except ImportError:
        return {"skipped": "flwr is not installed (pip install --constraint constraints.txt flwr)"}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    context = mp.get_context("spawn")
    results = context.Queue()
    server = context.Process(target=flower_server, args=(port, config, results))
    server.start()
    time.sleep(3.0)
    clients = [
        context.Process(target=flower_client, args=(i, port)) for i in range(config.participants)
    ]
    for client in clients:
        client.start()
    try:
        rounds = results.get(timeout=600)
    except Exception as exc:  # any failure of a third-party stack: report, don't crash
        return {"skipped": f"Flower did not finish: {exc!r}"}
    finally:
        for process in [server, *clients]:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    timed = rounds[1:]  # the first round pays for connection set-up
    round_s = float(np.median(timed))
    return {
        "rounds_timed": len(timed),
        "round_time_median_s": round_s,
        "round_times_s": timed,
        "cost_per_client_update_ms": 1000 * round_s / config.participants,
    }


# Report ----------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="A short run (fewer seconds).")
    parser.add_argument("--participants", type=int, default=8)
    parser.add_argument("--buffer-size", type=int, default=8)
    parser.add_argument(
        "--skip-flower", action="store_true", help="Only fedrl's figures (A/B runs of the server)."
    )
    args = parser.parse_args()
    config = BenchConfig(
        participants=args.participants,
        duration_s=5.0 if args.quick else 20.0,
        buffer_size=args.buffer_size,
        flower_rounds=2 if args.quick else 5,
    )
    ours = run_fedrl(config)
    flower = {"skipped": "--skip-flower"} if args.skip_flower else run_flower(config)

    print(f"{'':34}{'fedrl':>14}{'Flower FedAvg':>16}")
    flower_cost = flower.get("cost_per_client_update_ms")
    rows = [
        ("updates applied / s", f"{ours['updates_applied_per_s']:.1f}", "-"),
        ("push latency p50 (ms)", f"{ours['push_latency_p50_ms']:.1f}", "-"),
        ("push latency p99 (ms)", f"{ours['push_latency_p99_ms']:.1f}", "-"),
        ("versions created", str(ours["versions_created"]), "-"),
        ("server peak RSS (MB)", f"{ours['server_peak_rss_mb']:.0f}", "-"),
        (
            "server CPU per applied update (ms)",
            f"{ours['server_cpu_per_applied_update_ms']:.1f}",
            "-",
        ),
        ("load average (start, end)", "{:.1f}, {:.1f}".format(*ours["load_average_1min"]), "-"),
        (
            "round time (s)",
            "-",
            f"{flower['round_time_median_s']:.2f}" if "round_time_median_s" in flower else "-",
        ),
        (
            "cost per client update (ms)",
            f"{ours['cost_per_applied_update_ms']:.1f}",
            f"{flower_cost:.1f}" if flower_cost is not None else "-",
        ),
    ]
    for label, mine, theirs in rows:
        print(f"{label:34}{mine:>14}{theirs:>16}")
    if "skipped" in flower:
        print(f"Flower: {flower['skipped']}")
    targets = {
        "updates_per_s": ours["updates_applied_per_s"] >= TARGET_UPDATES_PER_S,
        "p99_push": ours["push_latency_p99_ms"] < TARGET_P99_MS,
        "cost_vs_flower": None
        if flower_cost is None
        else ours["cost_per_applied_update_ms"] <= flower_cost,
    }
    print(
        json.dumps(
            {
                "bench": "server",
                "quick": args.quick,
                "config": asdict(config),
                "fedrl": ours,
                "flower": flower,
                "targets_met": targets,
            }
        )
    )


if __name__ == "__main__":
    main()
