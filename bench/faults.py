"""Faults under load: participants push on while the server is killed and the network misbehaves.

A real `fedrl-server` process (fedrl.server.launcher) on loopback, reached
only through a small asyncio TCP proxy of this file's own that delays
forwarded data, blackholes connections for a while and cuts them with a TCP
reset. N simulated participants (asyncio tasks on grpc.aio channels) push
weight updates and experience batches, pull the model and experience, for
`--duration` seconds; meanwhile the server is SIGKILLed and started again on
the same data dir and port `--restarts` times at random moments.

Every update is a one-hot delta: +1 at a coordinate that belongs to that
(participant, sequence) alone, and the server makes one version per update
(--buffer-size 1), so the final model says exactly how often each update was
applied: 1 once, 2 doubled, 0 lost. A participant resends an update under
the same sequence until it is acknowledged (as fedrl-client's outbox does),
so a reply lost in transit comes back as a duplicate answer, never twice.

Figures: updates acknowledged (to participants) vs applied (in the final
model), doubled (must be 0), lost (must be 0), refused (statuses that are not
transport failures; must be 0), experience batches acknowledged vs stored,
server RSS over time (sampled every second), p50/p99 push latency (one
successful attempt) and ack latency (first send to ack, retries included),
versions made, and the faults injected.

    .venv/bin/python bench/faults.py                  # 32 participants, 60 s, 5 kills
    .venv/bin/python bench/faults.py --participants 8 --duration 20 --restarts 2

The last line of stdout is one JSON object with every figure;
tests/test_faults_under_load.py runs the short form and checks its invariants.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import socket
import sqlite3
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil

from fedrl.common.chunking import chunk_tensors
from fedrl.common.experience import ExperienceBatch, batch_messages
from fedrl.common.identity import id_to_metadata
from fedrl.common.spec import spec_hash
from fedrl.proto.v1 import experience_pb2 as xpb
from fedrl.proto.v1 import experience_pb2_grpc as xpb_grpc
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.proto.v1 import tensor_pb2 as tpb
from fedrl.server.launcher import ServerProcess
from fedrl.server.storage.model_store import ModelStore

SLOTS = 2048
"""Coordinates per participant: its updates' sequence numbers run 1..SLOTS."""
OBS = 4
CALL_TIMEOUT_S = 10.0
CHANNEL_OPTIONS = [
    # One TCP connection per participant, as separate processes would have:
    # channels in one process otherwise share one connection to a target.
    ("grpc.use_local_subchannel_pool", 1),
    # Reconnect quickly after a kill or a cut, as fedrl-client's channel does.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 100),
]
TRANSPORT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        # A grpc.aio client whose stream was cut mid-write reports INTERNAL
        # ("Internal error from Core") or UNKNOWN for the transport's failure.
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)
"""What a killed server or a cut connection looks like to a participant: retry."""


def spec(participants: int) -> tpb.ModelSpec:
    low, high = [-10.0] * OBS, [10.0] * OBS
    return tpb.ModelSpec(
        tensors=[tpb.TensorSpec(name="w", dtype=tpb.DTYPE_FLOAT32, shape=[participants * SLOTS])],
        env_id="faults-v0",
        observation_space=tpb.SpaceSpec(
            kind=tpb.SPACE_KIND_BOX, shape=[OBS], dtype=tpb.DTYPE_FLOAT32, low=low, high=high
        ),
        action_space=tpb.SpaceSpec(kind=tpb.SPACE_KIND_DISCRETE, n=2, dtype=tpb.DTYPE_INT64),
        algorithm="dqn/faults",
    )


# The proxy.


@dataclass
class ProxyFaults:
    """How the proxy misbehaves, per connection and per forwarded piece of data."""

    delay_probability: float = 0.2
    """Share of forwarded pieces held back for up to max_delay_s."""
    max_delay_s: float = 0.05
    cut_probability: float = 0.3
    """Chance, every 0.5-5 s of a connection's life, that it is reset (RST)."""
    blackhole_probability: float = 0.1
    """Chance, every 0.5-5 s, that it stops forwarding for 1-3 s and is then reset."""


@dataclass
class ProxyCounts:
    connections: int = 0
    delayed: int = 0
    cut: int = 0
    blackholed: int = 0


class ChaosProxy:
    """A loopback TCP proxy that delays, blackholes and cuts, on its own event loop thread."""

    def __init__(self, upstream_port: int, faults: ProxyFaults, seed: int) -> None:
        self.upstream_port = upstream_port
        self.faults = faults
        self.counts = ProxyCounts()
        self.port = 0
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> ChaosProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(10)
        return self

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.counts.connections += 1
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            _reset(client_w)
            return
        pipes = [
            asyncio.ensure_future(self._pipe(client_r, server_w)),
            asyncio.ensure_future(self._pipe(server_r, client_w)),
        ]
        try:
            # Every 0.5-5 s of its life a connection may be cut or blackholed.
            while True:
                done, _ = await asyncio.wait(
                    pipes,
                    timeout=self._random.uniform(0.5, 5.0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if done:
                    return
                fate = self._random.random()
                if fate < self.faults.cut_probability:
                    self.counts.cut += 1
                    return
                if fate < self.faults.cut_probability + self.faults.blackhole_probability:
                    self.counts.blackholed += 1
                    for pipe in pipes:
                        pipe.cancel()
                    await asyncio.sleep(self._random.uniform(1.0, 3.0))
                    return
        finally:
            for pipe in pipes:
                pipe.cancel()
            _reset(client_w)
            _reset(server_w)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self._random.random() < self.faults.delay_probability:
                self.counts.delayed += 1
                await asyncio.sleep(self._random.uniform(0, self.faults.max_delay_s))
            writer.write(data)
            await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed peer or a middlebox does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# The participants.


@dataclass
class Tally:
    """What the participants saw."""

    acked: set[tuple[str, int]] = field(default_factory=set)
    duplicates: int = 0
    refused: list[str] = field(default_factory=list)
    transport_failures: int = 0
    stale_retries: int = 0
    push_latency_s: list[float] = field(default_factory=list)
    ack_latency_s: list[float] = field(default_factory=list)
    experience_acked: set[tuple[str, int]] = field(default_factory=set)
    pulls: int = 0
    experience_pulls: int = 0


class Participant:
    def __init__(self, index: int, address: str, model: tpb.ModelSpec, tally: Tally) -> None:
        self.pid = f"p{index:02d}-Участник"
        self.index = index
        self.spec = model
        self.tally = tally
        self.metadata = [id_to_metadata(self.pid)]
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.federation = pb_grpc.FederationStub(self.channel)  # type: ignore[no-untyped-call]
        self.experience = xpb_grpc.ExperienceExchangeStub(self.channel)  # type: ignore[no-untyped-call]
        self.version = 0
        self.random = random.Random(index)

    async def run(self, until: float) -> None:
        await self._until_done(self._join)
        sequence = 0
        while time.monotonic() < until and sequence < SLOTS:
            sequence += 1
            await self._push_until_acked(sequence, until)
            if self.random.random() < 0.3:
                await self._attempt(self._pull)
            if self.random.random() < 0.3:
                await self._push_experience_until_acked(sequence, until)
            if self.random.random() < 0.3:
                await self._attempt(self._pull_experience)
        await self.channel.close()

    async def _join(self) -> None:
        reply = await self.federation.Join(
            pb.JoinRequest(
                session="default",
                participant_id=self.pid,
                spec=self.spec,
                spec_hash=spec_hash(self.spec),
            ),
            metadata=self.metadata,
            timeout=CALL_TIMEOUT_S,
        )
        self.version = max(reply.current_version, 0)

    async def _push_until_acked(self, sequence: int, until: float) -> None:
        delta = np.zeros(self.spec.tensors[0].shape[0], np.float32)
        delta[self.index * SLOTS + sequence - 1] = 1.0
        first_sent = time.monotonic()
        # Past the run's end an unacked update is given a little longer: the
        # figure is about what was acknowledged, and a participant retries.
        while time.monotonic() < until + 30:
            started = time.monotonic()
            try:
                reply = await self.federation.PushUpdate(
                    _aiter(self._update(sequence, delta)),
                    metadata=self.metadata,
                    timeout=CALL_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "stale" in (
                    exc.details() or ""
                ):
                    self.tally.stale_retries += 1
                    await self._attempt(self._get_version)
                    continue
                if not await self._transport_failure(exc, f"push {sequence}"):
                    return
                continue
            now = time.monotonic()
            self.tally.push_latency_s.append(now - started)
            self.tally.ack_latency_s.append(now - first_sent)
            self.tally.acked.add((self.pid, sequence))
            self.tally.duplicates += reply.duplicate
            self.version = max(self.version, reply.current_version)
            return

    def _update(self, sequence: int, delta: np.ndarray) -> list[pb.UpdateChunk]:
        header_tensors, chunks = chunk_tensors([("w", delta)], dtype=tpb.DTYPE_BFLOAT16)
        header = pb.UpdateHeader(
            session="default",
            participant_id=self.pid,
            sequence=sequence,
            base_version=self.version,
            env_steps=100,
            episodes=1,
            samples=100,
            spec_hash=spec_hash(self.spec),
            tensors=header_tensors,
        )
        return [pb.UpdateChunk(header=header), *(pb.UpdateChunk(chunk=c) for c in chunks)]

    async def _push_experience_until_acked(self, sequence: int, until: float) -> None:
        rows = 16
        states = np.asarray(
            [[self.random.uniform(-1, 1) for _ in range(OBS)] for _ in range(rows + 1)],
            np.float32,
        )
        batch = ExperienceBatch(
            obs=states[:-1],
            action=np.asarray([self.random.randrange(2) for _ in range(rows)], np.int64),
            reward=np.ones(rows, np.float32),
            next_obs=states[1:],
            discount=np.full(rows, 0.99, np.float32),
            terminated=np.zeros(rows, bool),
            truncated=np.zeros(rows, bool),
            n_step=1,
            gamma=0.99,
            env_spec_hash=spec_hash(self.spec),
        )
        messages = batch_messages(
            batch, session="default", participant_id=self.pid, sequence=sequence
        )
        while time.monotonic() < until + 30:
            try:
                await self.experience.PushExperience(
                    _aiter(messages), metadata=self.metadata, timeout=CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                if not await self._transport_failure(exc, f"experience {sequence}"):
                    return
                continue
            self.tally.experience_acked.add((self.pid, sequence))
            return

    async def _pull(self) -> None:
        request = pb.PullModelRequest(session="default", participant_id=self.pid, version=-1)
        async for _ in self.federation.PullModel(
            request, metadata=self.metadata, timeout=CALL_TIMEOUT_S
        ):
            pass
        self.tally.pulls += 1

    async def _pull_experience(self) -> None:
        request = xpb.PullExperienceRequest(
            session="default", participant_id=self.pid, max_transitions=256
        )
        async for _ in self.experience.PullExperience(
            request, metadata=self.metadata, timeout=CALL_TIMEOUT_S
        ):
            pass
        self.tally.experience_pulls += 1

    async def _get_version(self) -> None:
        notice = await self.federation.GetVersion(
            pb.GetVersionRequest(session="default", participant_id=self.pid),
            metadata=self.metadata,
            timeout=CALL_TIMEOUT_S,
        )
        self.version = max(self.version, notice.current_version)

    async def _until_done(self, call: Any) -> None:
        while not await self._attempt(call):
            pass

    async def _attempt(self, call: Any) -> bool:
        try:
            await call()
        except grpc.aio.AioRpcError as exc:
            await self._transport_failure(exc, call.__name__)
            return False
        return True

    async def _transport_failure(self, exc: grpc.aio.AioRpcError, what: str) -> bool:
        """True (after a short pause) for a failure to retry; False, noted, for a refusal."""
        code = exc.code()
        throttled = code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit" in (exc.details() or "")
        if code in TRANSPORT or throttled:
            self.tally.transport_failures += 1
            await asyncio.sleep(self.random.uniform(0.05, 0.3))
            return True
        self.tally.refused.append(f"{self.pid} {what}: {code.name}: {exc.details()}")
        return False


async def _aiter(messages: list[Any]) -> AsyncIterator[Any]:
    for message in messages:
        yield message


# The run.


@dataclass
class Settings:
    participants: int = 32
    duration_s: float = 60.0
    restarts: int = 5
    seed: int = 0
    faults: ProxyFaults = field(default_factory=ProxyFaults)


def kill_times(settings: Settings, rng: random.Random) -> list[float]:
    """Random moments in the run, at least 3 s apart and away from its ends."""
    margin = min(5.0, settings.duration_s / 6)
    while True:
        times = sorted(
            rng.uniform(margin, settings.duration_s - margin) for _ in range(settings.restarts)
        )
        if all(b - a >= 3.0 for a, b in itertools.pairwise(times)):
            return times


def run(settings: Settings, work_dir: Path) -> dict[str, Any]:
    rng = random.Random(settings.seed)
    model = spec(settings.participants)
    port = _free_port()
    server = ServerProcess(
        work_dir / "server",
        "--buffer-size",
        "1",
        "--push-rate-per-s",
        "1000",
        "--push-burst",
        "1000",
        "--goal-episodes",
        str(10**9),
        "--keep-last",
        "2",
        port=port,
        log=work_dir / "server.log",
    ).start()
    _seed(server.address, model)
    proxy = ChaosProxy(port, settings.faults, settings.seed).start()
    tally = Tally()
    rss: list[tuple[float, float]] = []
    kills: list[float] = []
    start = time.monotonic()
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(1.0):
            with contextlib.suppress(psutil.Error, RuntimeError):
                rss.append(
                    (time.monotonic() - start, psutil.Process(server.pid).memory_info().rss / 2**20)
                )

    async def participants() -> None:
        address = f"127.0.0.1:{proxy.port}"
        until = start + settings.duration_s
        group = [Participant(i, address, model, tally) for i in range(settings.participants)]
        await asyncio.gather(*(p.run(until) for p in group))

    # The participants run on a thread of their own: kills and restarts stay
    # on this one, which outlives every server it starts (the launcher's
    # servers die with the thread that started them).
    load = threading.Thread(target=asyncio.run, args=(participants(),), name="participants")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load.start()
    for moment in kill_times(settings, rng):
        time.sleep(max(0.0, start + moment - time.monotonic()))
        server.kill()
        kills.append(time.monotonic() - start)
        server.start()
    load.join()
    elapsed = time.monotonic() - start
    stop_sampling.set()
    sampler.join()
    proxy.stop()
    exit_status = server.stop()
    return report(
        settings, work_dir / "server", model, tally, rss, kills, proxy, elapsed, exit_status
    )


def _seed(address: str, model: tpb.ModelSpec) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
        metadata = [id_to_metadata("seeder")]
        digest = spec_hash(model)
        stub.Join(
            pb.JoinRequest(
                session="default", participant_id="seeder", spec=model, spec_hash=digest
            ),
            metadata=metadata,
        )
        zeros = np.zeros(model.tensors[0].shape[0], np.float32)
        header_tensors, chunks = chunk_tensors([("w", zeros)])
        header = pb.ModelUploadHeader(
            session="default", participant_id="seeder", spec_hash=digest, tensors=header_tensors
        )
        messages = [pb.ModelUpload(header=header), *(pb.ModelUpload(chunk=c) for c in chunks)]
        stub.SeedModel(iter(messages), metadata=metadata)


def report(  # noqa: PLR0917 - one call site, every argument a figure's source
    settings: Settings,
    data_dir: Path,
    model: tpb.ModelSpec,
    tally: Tally,
    rss: list[tuple[float, float]],
    kills: list[float],
    proxy: ChaosProxy,
    elapsed: float,
    exit_status: int | None,
) -> dict[str, Any]:
    with sqlite3.connect(f"file:{data_dir / 'state.sqlite3'}?mode=ro", uri=True) as db:
        latest = db.execute("SELECT MAX(version) FROM versions WHERE session='default'").fetchone()[
            0
        ]
        ack_rows = db.execute(
            "SELECT participant_id, sequence, applied_version FROM acks WHERE session='default'"
        ).fetchall()
        stored_experience = {
            (pid, seq)
            for pid, seq in db.execute(
                "SELECT participant_id, sequence FROM experience_acks WHERE session='default'"
            )
        }
        quarantined = db.execute("SELECT COUNT(*) FROM quarantined").fetchone()[0]
    store = ModelStore(data_dir / "sessions" / "default" / "checkpoints")
    ((_, weights),) = store.load(latest)
    counts = np.rint(weights).astype(np.int64)
    names = [f"p{i:02d}-Участник" for i in range(settings.participants)]
    applied = {(names[c // SLOTS], c % SLOTS + 1): int(counts[c]) for c in np.flatnonzero(counts)}
    pending = sum(1 for _, _, version in ack_rows if version is None)
    lost = sorted(tally.acked - set(applied))
    doubled = sorted(key for key, times in applied.items() if times > 1)
    latencies = sorted(tally.push_latency_s)
    acks = sorted(tally.ack_latency_s)
    values = [mb for _, mb in rss]
    third = max(1, len(values) // 3)
    return {
        "settings": asdict(settings),
        "elapsed_s": round(elapsed, 1),
        "server_exit_status": exit_status,
        "kills_at_s": [round(k, 1) for k in kills],
        "updates_acknowledged": len(tally.acked),
        "updates_applied": len(applied),
        "acknowledged_and_applied": len(tally.acked & set(applied)),
        "applied_ack_lost_in_transit": len(set(applied) - tally.acked),
        "doubled": len(doubled),
        "lost": len(lost),
        "lost_examples": [list(k) for k in lost[:5]],
        "server_ack_rows": len(ack_rows),
        "server_acks_pending": pending,
        "quarantined": quarantined,
        "non_integer_coordinates": int(np.count_nonzero(np.abs(weights - np.rint(weights)) > 1e-6)),
        "duplicate_answers": tally.duplicates,
        "refused": len(tally.refused),
        "refused_examples": tally.refused[:5],
        "transport_failures_retried": tally.transport_failures,
        "stale_retries": tally.stale_retries,
        "experience_acknowledged": len(tally.experience_acked),
        "experience_stored": len(stored_experience),
        "experience_lost": len(tally.experience_acked - stored_experience),
        "pulls": tally.pulls,
        "experience_pulls": tally.experience_pulls,
        "versions": latest,
        "push_latency_p50_s": _percentile(latencies, 50),
        "push_latency_p99_s": _percentile(latencies, 99),
        "ack_latency_p50_s": _percentile(acks, 50),
        "ack_latency_p99_s": _percentile(acks, 99),
        "rss_mb_max": round(max(values), 1) if values else None,
        "rss_mb_median_first_third": round(statistics.median(values[:third]), 1)
        if values
        else None,
        "rss_mb_median_last_third": round(statistics.median(values[-third:]), 1)
        if values
        else None,
        "rss_mb_over_time": [[round(t, 1), round(mb, 1)] for t, mb in rss],
        "proxy": asdict(proxy.counts),
        "load": os.getloadavg()[0],
    }


def _percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 4) if values else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--participants", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--restarts", type=int, default=5, help="SIGKILLs of the server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, help="keep the server's data here")
    args = parser.parse_args()
    settings = Settings(args.participants, args.duration, args.restarts, args.seed)
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        figures = run(settings, work)
    print(
        f"{settings.participants} participants, {figures['elapsed_s']} s, server killed at "
        f"{figures['kills_at_s']} s; proxy: {figures['proxy']}\n"
        f"updates acknowledged {figures['updates_acknowledged']}, applied "
        f"{figures['updates_applied']} (both: {figures['acknowledged_and_applied']}), "
        f"doubled {figures['doubled']}, lost {figures['lost']}, refused {figures['refused']}, "
        f"quarantined {figures['quarantined']}\n"
        f"experience acknowledged {figures['experience_acknowledged']}, stored "
        f"{figures['experience_stored']}, lost {figures['experience_lost']}\n"
        f"push latency p50 {figures['push_latency_p50_s']} s, "
        f"p99 {figures['push_latency_p99_s']} s; ack latency (retries included) "
        f"p50 {figures['ack_latency_p50_s']} s, p99 "
        f"{figures['ack_latency_p99_s']} s\n"
        f"versions {figures['versions']}; server RSS max {figures['rss_mb_max']} MB, median "
        f"{figures['rss_mb_median_first_third']} MB (first third) -> "
        f"{figures['rss_mb_median_last_third']} MB (last third); load {figures['load']:.1f}",
        flush=True,
    )
    print(json.dumps(figures, ensure_ascii=False))


if __name__ == "__main__":
    main()
