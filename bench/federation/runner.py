"""One run: a fresh `fedrl-server` (none for a lone or pooled learner), its participant processes
started together, and the run's models scored at every mark once they are done.

The server runs with the product's defaults except four options, each
commented where it is given (BenchServer).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import grpc
import psutil

from bench.federation.participant import (
    ParticipantReport,
    ParticipantTask,
    Weights,
    architecture,
    initial_weights,
    learner_config,
    paced_by,
)
from bench.federation.results import RunResult
from bench.federation.scoring import score_run
from bench.federation.settings import (
    SERVERLESS_MODES,
    SESSION,
    SHARE,
    Configuration,
    Settings,
)
from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.model_spec import model_spec
from fedrl.common.group_rules_serde import choices_to_proto
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.proto.v1 import federation_pb2_grpc as pb_grpc
from fedrl.server.launcher import ServerProcess

REPOSITORY = Path(__file__).resolve().parents[2]
"""Where `bench` is importable from: the participant processes run `-m bench.federation...`."""


class BenchServer(ServerProcess):
    """The run's `fedrl-server serve` child (fedrl.server.launcher) on a free loopback port.

    Like the participants (die_with_parent), it dies with the bench, so an
    interrupted bench leaves nothing behind burning the shared cores.
    """

    def __init__(self, data_dir: Path, settings: Settings) -> None:
        options = [
            # Every version stays on disk: the bench scores them after the run.
            *("--keep-last", "1000000"),
            # The run ends by budget, not by goal.
            *("--goal-episodes", "100000000"),
            # Benchmarks measure training, not the page.
            "--no-dashboard",
            # A simulated env syncs far more often than a real one: at the default limit
            # (2 pushes/s, bursts of 10) wall clock, not the sync interval, would decide how
            # often versions go out, and figures in env steps would depend on the machine.
            *("--push-rate-per-s", "1000"),
            *("--push-burst", "1000"),
        ]
        if settings.buffer_size is not None:
            options += ["--buffer-size", str(settings.buffer_size)]
        if settings.server_lr is not None:
            options += ["--server-lr", str(settings.server_lr)]
        super().__init__(data_dir, *options)
        self.start()

    def versions(self) -> list[pb.VersionState]:
        """Every committed version, oldest first, with its time and checkpoint file."""
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.FederationStub(channel)  # type: ignore[no-untyped-call]
            reply = stub.Status(pb.StatusRequest(session=SESSION, max_versions=1_000_000))
        if not reply.sessions:
            return []
        return sorted(reply.sessions[0].versions, key=lambda v: v.version)

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)


def seed_session(
    address: str, weights: Weights, settings: Settings, configuration: Configuration
) -> None:
    """Version 0: the run's initial network, seeded by the bench itself.

    Its Join creates the session, so it chooses the rules the participants
    will choose: a session fixes its rules at creation and refuses members
    that ask for others.
    """
    algo = configuration.algo
    spec = model_spec(settings.env, weights, architecture(learner_config(settings, algo)))
    rules = choices_to_proto(settings.rule_choices(SHARE[configuration.mode]))

    async def seed_it() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            client = FederationClient(channel, participant_id="bench", session=SESSION)
            await client.join(spec, rules=rules)
            await client.seed_model(weights)

    asyncio.run(seed_it())


class Participant:
    """A participant process (bench.federation.participant), its log in a file."""

    def __init__(self, task: ParticipantTask, log_path: Path) -> None:
        self.task = task
        self.log_path = log_path
        self._log = log_path.open("w", encoding="utf-8")
        path = os.pathsep.join(p for p in (str(REPOSITORY), os.environ.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.federation.participant", json.dumps(asdict(task))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path},
        )

    def wait_ready(self, timeout_s: float) -> None:
        assert self.process.stdout is not None
        ready = threading.Event()

        def read() -> None:
            assert self.process.stdout is not None
            if self.process.stdout.readline().strip() == "ready":
                ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout_s):
            raise RuntimeError(f"participant {self.task.index} not ready:\n{self.log_text()}")

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def wait(self, timeout_s: float) -> ParticipantReport:
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(
                f"participant {self.task.index} ran past {timeout_s:.0f} s"
            ) from None
        if code != 0:
            raise RuntimeError(f"participant {self.task.index} exited {code}:\n{self.log_text()}")
        raw = json.loads(Path(self.task.result_path).read_text("utf-8"))
        self._log.flush()
        # The client logs each refused push ("... rate limit ...") before retrying it.
        throttled = self.log_path.read_text("utf-8").count("rate limit")
        return ParticipantReport(**{**raw, "throttled": throttled})

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text("utf-8")[-4000:]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._log.close()


def run_configuration(
    configuration: Configuration,
    seed: int,
    settings: Settings,
    work_dir: Path,
    *,
    timeout_s: float = 3_600.0,
) -> RunResult:
    """A fresh server (none for a lone or pooled learner) and its participants; returns the
    scores at every mark."""
    run_dir = work_dir / f"{configuration.key.replace(' ', '_')}_seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    initial = initial_weights(settings, seed, configuration.algo)
    serverless = configuration.mode in SERVERLESS_MODES
    server = None if serverless else BenchServer(run_dir / "server", settings)
    # What the processes run by: a lone learner's budget may be its own; a pooled learner's
    # budget and marks are N participants' (pooled over 1, everyone else's settings are the
    # invocation's).
    per_participant = settings.of(configuration.mode)
    run_settings = per_participant.pooled(configuration.pooled_over)
    participants: list[Participant] = []
    pace_files = [str(run_dir / f"p{index}.steps") for index in range(configuration.processes)]
    follows = [paced_by(configuration, settings, index) for index in range(configuration.processes)]
    # Only a participant someone follows writes its steps: the others skip a file write a round.
    followed = {other for others in follows for other in others}
    try:
        if server is not None:
            seed_session(server.address, initial, settings, configuration)
        for index in range(configuration.processes):
            task = ParticipantTask(
                index=index,
                participant_id=f"p{index}",
                address="" if server is None else server.address,
                state_dir=str(run_dir / f"p{index}"),
                result_path=str(run_dir / f"p{index}.json"),
                seed=seed,
                mode=configuration.mode,
                settings=run_settings,
                algo=configuration.algo,
                replay_ratio=configuration.replay_ratio,
                learns=configuration.mode != "roles" or index == 0,
                save_local=index == 0,
                pace_post=pace_files[index] if index in followed else "",
                pace_follow=tuple(pace_files[other] for other in follows[index]),
            )
            participants.append(Participant(task, run_dir / f"p{index}.log"))
        for participant in participants:
            participant.wait_ready(300.0)
        start_ms = int(time.time() * 1000)
        for participant in participants:
            participant.go()
        reports = [p.wait(timeout_s) for p in participants]
        run_seconds = time.time() - start_ms / 1000
        versions = [] if server is None else server.versions()
        server_cpu = 0.0 if server is None else server.cpu_seconds()
    finally:
        for participant in participants:
            participant.kill()
        if server is not None:
            server.stop()
    curve = score_run(
        configuration,
        seed,
        run_settings,
        run_dir=run_dir,
        start_ms=start_ms,
        reports=reports,
        versions=versions,
        initial=initial,
    )
    return RunResult(
        configuration=configuration,
        seed=seed,
        marks=per_participant.marks,
        returns=curve.returns,
        seconds=curve.seconds,
        versions=curve.versions,
        own_returns=curve.own_returns,
        initial_return=curve.initial_return,
        participants=reports,
        total_versions=len(versions),
        run_seconds=run_seconds,
        server_cpu_seconds=server_cpu,
        target=settings.target,
    )
