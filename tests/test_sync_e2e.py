"""End to end over loopback: `fedrl-server` and `fedrl-client` processes, kills and restarts.

The participants run serially (--workers 0) with small networks so that two
of them and a server share two cores; the learning test still uses the
default learner, because "the global model got better" is its point.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from fedrl.client.federation.federation_client import FederationClient
from fedrl.client.federation.model_spec import model_spec
from fedrl.client.federation.outbox import Outbox
from fedrl.client.training.engine import TrainingEngine
from fedrl.client.training.engine_config import EngineConfig
from fedrl.client.training.learner_config import LearnerConfig
from fedrl.client.training.q_network import architecture_name
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.polling import wait_until
from tests.support.ports import free_port
from tests.support.server_harness import InProcessServer, ServerProcess, server_config

CLIENT = [sys.executable, "-c", "from fedrl.client.commands.cli import main; main()"]
SERIAL = ["--workers", "0", "--envs-per-worker", "4", "--eval-interval", "0"]
FAST = [*SERIAL, "--hidden", "32,32"]
_STOPPED = re.compile(r"stopped at episode (\d+)")
_RESUMED = re.compile(r"resuming \S+ at episode (\d+)")


class Participant:
    """One `fedrl-client` process; its combined output is kept for assertions."""

    def __init__(self, server: str, state_dir: Path, participant_id: str, *options: str) -> None:
        command = [
            *CLIENT,
            "--participant-id",
            participant_id,
            "--server",
            server,
            "--state-dir",
            str(state_dir),
            "--episodes",
            "100000",
            "--sync-interval",
            "5",
            *options,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: list[str] = []
        # Also on disk, whole: an assertion message truncates it.
        self.log = state_dir.parent / f"{participant_id}.log"
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.log.open("a", encoding="utf-8") as log:
            for line in self.process.stdout:
                self.lines.append(line)
                log.write(line)
                log.flush()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"participant did not finish:\n{self.output}") from None
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def stopped_at(self) -> int:
        found = _STOPPED.findall(self.output)
        assert found, f"no final line in:\n{self.output}"
        return int(found[-1])


@pytest.fixture
def processes() -> Iterator[list[Participant | ServerProcess]]:
    """Everything a test starts; killed at the end whatever happened."""
    started: list[Participant | ServerProcess] = []
    yield started
    for process in started:
        process.kill()


def status(server: ServerProcess) -> pb.SessionState:
    """The default session's state; empty before the first participant creates it."""
    reply = server.stub().Status(pb.StatusRequest(max_versions=10_000))
    return reply.sessions[0] if reply.sessions else pb.SessionState()


def start_server(
    data_dir: Path, processes: list[Participant | ServerProcess], *options: str
) -> ServerProcess:
    server = ServerProcess(data_dir, "--buffer-size", "2", "--buffer-timeout-s", "1", *options)
    processes.append(server.start())
    return server


def start_participant(
    processes: list[Participant | ServerProcess], *args: str, options: Sequence[str] = FAST
) -> Participant:
    participant = Participant(args[0], Path(args[1]), args[2], *options)
    processes.append(participant)
    return participant


def seed_session(address: str, participant_id: str, hidden: tuple[int, ...]) -> None:
    """Create the default session with a CartPole Q-network of the given hidden sizes."""
    learner = LearnerConfig(hidden=hidden, device="cpu")
    engine = TrainingEngine(EngineConfig(workers=0, eval_interval=0), learner)
    weights = engine.weights()
    engine.close()
    spec = model_spec("CartPole-v1", weights, architecture_name(hidden, learner.dueling))

    async def join_and_seed() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            client = FederationClient(channel, participant_id=participant_id, session="default")
            await client.join(spec)
            await client.seed_model(weights)

    asyncio.run(join_and_seed())


def test_incompatible_model_exits_nonzero_with_the_reason_and_touches_nothing(
    tmp_path: Path,
) -> None:
    with InProcessServer(server_config(tmp_path / "server")) as server:
        seed_session(server.address, "alice", (32, 32))

        refused = subprocess.run(
            [
                *CLIENT,
                "--participant-id",
                "bob",
                "--server",
                server.address,
                "--state-dir",
                str(tmp_path / "state"),
                *SERIAL,
                "--hidden",
                "16",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert refused.returncode != 0
    assert "model spec differs from session 'default'" in refused.stderr
    assert "algorithm: session has 'dqn/dueling-mlp-32x32'" in refused.stderr
    assert not (tmp_path / "state" / "bob").exists()


def test_zero_episodes_prints_the_status_and_changes_nothing(tmp_path: Path) -> None:
    with InProcessServer(server_config(tmp_path / "server")) as server:
        seed_session(server.address, "Макар", (32, 32))
        before = server.stub().Status(pb.StatusRequest(session="default")).sessions[0]

        shown = subprocess.run(
            [
                *CLIENT,
                "--server",
                server.address,
                "--episodes",
                "0",
                "--state-dir",
                str(tmp_path / "state"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        after = server.stub().Status(pb.StatusRequest(session="default")).sessions[0]

    assert shown.returncode == 0, shown.stderr
    assert "Макар" in shown.stdout
    assert "goal" in shown.stdout
    assert not (tmp_path / "state").exists()
    assert after.participants == before.participants
    assert after.goal == before.goal
    assert after.current_version == before.current_version


@pytest.mark.slow
def test_two_participants_reach_the_goal_and_the_global_model_improves(
    tmp_path: Path, processes: list[Participant | ServerProcess]
) -> None:
    server = start_server(tmp_path / "server", processes, "--goal-episodes", "500")
    learning = ["--workers", "0", "--envs-per-worker", "4", "--eval-interval", "2000"]
    pair = [
        start_participant(processes, server.address, str(tmp_path / "s"), pid, options=learning)
        for pid in ("Макар", "alice")
    ]

    codes = [p.wait(540) for p in pair]

    assert codes == [0, 0], [p.output for p in pair]
    state = status(server)
    contributions = {p.participant_id: p.episodes for p in state.participants}
    assert contributions == {"Макар": pair[0].stopped_at(), "alice": pair[1].stopped_at()}
    assert sum(contributions.values()) == state.goal.episodes_done >= 500
    initial = next(v for v in state.versions if v.version == 0)
    assert state.HasField("best_eval_return") and initial.HasField("eval_return")
    # An untrained greedy CartPole policy scores about 9; by 500 episodes
    # between them the participants' global model balances far longer.
    assert state.best_eval_return > initial.eval_return + 20


@pytest.mark.slow
def test_participant_killed_mid_run_resumes_and_nothing_is_applied_twice_or_lost(
    tmp_path: Path, processes: list[Participant | ServerProcess]
) -> None:
    server = start_server(tmp_path / "server", processes, "--goal-episodes", "400")
    assert server.running
    state_dir = tmp_path / "state"
    outbox_dir = state_dir / "alice" / "sync" / "default" / "outbox"
    first = start_participant(processes, server.address, str(state_dir), "alice")
    wait_until(
        lambda: sum(p.updates_accepted for p in status(server).participants) >= 4,
        180,
        "four acknowledged updates",
    )

    # Play "the ack arrived but the process died before deleting the entry":
    # freeze the server so that the next push stays in flight, copy its entry,
    # let the server acknowledge it, then kill the participant and put the
    # copy back where the lost deletion would have left it.
    server.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: any(outbox_dir.glob("update-*.sent")), 120, "a push in flight")
        in_flight = next(outbox_dir.glob("update-*.sent"))
        saved = in_flight.read_bytes()
    finally:
        server.send_signal(signal.SIGCONT)
    wait_until(lambda: not in_flight.exists(), 120, "the acknowledgement")
    first.process.send_signal(signal.SIGKILL)
    first.wait(30)
    acknowledged = status(server).participants[0]
    in_flight.write_bytes(saved)

    second = start_participant(processes, server.address, str(state_dir), "alice")
    code = second.wait(300)

    assert code == 0, second.output
    resumed = int(_RESUMED.findall(second.output)[0])
    assert resumed >= acknowledged.episodes
    final = status(server).participants[0]
    assert final.updates_duplicate >= 1
    # Every episode the participant counts reached the server exactly once.
    assert final.episodes == second.stopped_at()
    assert Outbox(outbox_dir).pending("update") == []


@pytest.mark.slow
def test_server_killed_and_restarted_mid_run_participants_reconnect_and_finish(
    tmp_path: Path, processes: list[Participant | ServerProcess]
) -> None:
    port = free_port()
    # A goal the pair cannot reach before the kill: on an idle machine two such
    # participants play 400 episodes in about a second, before the test sees
    # their fourth update.
    options = ("--goal-episodes", "2000", "--port", str(port))
    server = start_server(tmp_path / "server", processes, *options)
    pair = [
        start_participant(processes, server.address, str(tmp_path / "s"), pid)
        for pid in ("Макар", "alice")
    ]
    wait_until(
        lambda: sum(p.updates_accepted for p in status(server).participants) >= 4,
        180,
        "four acknowledged updates",
    )

    server.kill()
    wait_until(
        lambda: all("server unreachable" in p.output for p in pair),
        120,
        "both participants to notice the server is gone",
    )
    server.start()
    codes = [p.wait(300) for p in pair]

    assert codes == [0, 0], [p.output for p in pair]
    assert all("server unreachable" in p.output for p in pair)
    state = status(server)
    assert state.goal.reached
    contributions = {p.participant_id: p.episodes for p in state.participants}
    expected = {"Макар": pair[0].stopped_at(), "alice": pair[1].stopped_at()}
    assert contributions == expected, [p.output for p in pair]
