"""Running the bench's jobs side by side, and reading what each member's metrics say.

A job is one independent or default run, or one whole population (its
server and every member, started together). Jobs run at most `jobs`
processes at a time (a population counts as its size but is never split),
each member's CPU seconds read from the kernel when it is reaped (wait4),
so the figures are per member whatever else the machine runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.federation.participant import die_with_parent
from bench.federation.scoring import reached_at
from fedrl.server.launcher import ServerProcess

CONSECUTIVE = 2
"""Evaluations in a row at or above the target that count as reaching it: one lucky
evaluation of a still-wobbling model does not."""


@dataclass(frozen=True)
class MemberOutcome:
    """One run's (one member's) figures, from its metrics.jsonl."""

    name: str
    steps_to_target: int | None
    """Its own env steps at the first of CONSECUTIVE evaluations at the target; None: never."""
    final_eval: float | None
    """Its last evaluation's mean return."""
    evaluations: list[tuple[int, float]]
    exploits: int
    cpu_s: float


@dataclass
class Job:
    """A run or a population: its members' commands, and a server for a population."""

    seed: int
    arm: str
    state: Path
    commands: dict[str, list[str]]
    server: list[str] | None = None
    """The population server's options; None: the members train offline."""
    started: float = 0.0
    processes: dict[int, tuple[str, subprocess.Popen[bytes]]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    _server: ServerProcess | None = None

    @property
    def size(self) -> int:
        return len(self.commands)

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        extra: list[str] = []
        if self.server is not None:
            self._server = ServerProcess(self.state / "server", *self.server)
            self._server.start()
            extra = ["--server", self._server.address, "--mode", "pbt", "--session", "pop"]
        for name, command in self.commands.items():
            log = (self.state / f"{name}.log").open("wb")
            # Members die with the bench: an interrupted bench leaves nothing on the cores.
            # (preexec_fn is safe here: the bench runs no threads.)
            process = subprocess.Popen(
                [*command, *extra],
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent,  # noqa: PLW1509
            )
            log.close()
            self.processes[process.pid] = (name, process)

    def reap(self) -> bool:
        """Collect members that ended (their CPU seconds); True once all have."""
        for pid, (name, process) in list(self.processes.items()):
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done == 0:
                continue
            process.returncode = os.waitstatus_to_exitcode(status)
            self.cpu[name] = usage.ru_utime + usage.ru_stime
            if process.returncode != 0:
                self.failed.append(name)
            del self.processes[pid]
        if self.processes:
            return False
        if self._server is not None:
            self._server.stop()
            self._server = None
        return True

    def kill(self) -> None:
        for _, process in self.processes.values():
            process.kill()
        if self._server is not None:
            self._server.stop()

    def failure(self) -> str:
        name = self.failed[0]
        text = (self.state / f"{name}.log").read_text(encoding="utf-8", errors="replace")
        return f"{self.arm} seed {self.seed}: {name} failed:\n{text[-3000:]}"

    def outcomes(self, target: float) -> list[MemberOutcome]:
        return [outcome(self.state, name, target, self.cpu[name]) for name in self.commands]


def outcome(state: Path, name: str, target: float, cpu_s: float) -> MemberOutcome:
    lines = (state / name / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    evaluations = [(int(r["env_steps"]), float(r["mean"])) for r in records if r["kind"] == "eval"]
    hit = reached_at([mean for _, mean in evaluations], target, consecutive=CONSECUTIVE)
    return MemberOutcome(
        name=name,
        steps_to_target=None if hit is None else evaluations[hit][0],
        final_eval=evaluations[-1][1] if evaluations else None,
        evaluations=evaluations,
        exploits=sum(1 for r in records if r["kind"] == "exploit"),
        cpu_s=cpu_s,
    )


def run_jobs(jobs: list[Job], *, limit: int, on_done: Callable[[Job], None]) -> None:
    """Run every job, at most `limit` processes at a time; `on_done(job)` as each ends."""
    pending, running = list(jobs), list[Job]()
    try:
        while pending or running:
            busy = sum(job.size for job in running)
            while pending and (not running or busy + min(pending[0].size, limit) <= limit):
                job = pending.pop(0)
                job.start()
                running.append(job)
                busy += job.size
            time.sleep(1.0)
            for job in [j for j in running if j.reap()]:
                running.remove(job)
                if job.failed:
                    raise RuntimeError(job.failure())
                on_done(job)
    finally:
        for job in running:
            job.kill()
