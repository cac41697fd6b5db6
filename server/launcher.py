"""`fedrl-server serve` as a child process: the one way tests, benchmarks and the demo start one.

start() binds the port asked for (0: any free one) and reads the real one
back from the server's "listening" line. kill() is SIGKILL, with no chance
to flush anything (what crash tests need); stop() is SIGTERM, the graceful
path, with SIGKILL once the grace period is over. The server's output
(stdout and stderr, in order) is kept in memory, or written to a log file.

The child asks Linux for SIGKILL when its parent goes (prctl
PR_SET_PDEATHSIG), so a parent that crashes or is killed, and so runs no
cleanup, leaves no server behind holding its port and its cores. Linux sends
it when the *thread* that started the child ends: start servers from a
thread that outlives them, such as the main one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Self, TextIO

LISTENING = re.compile(r"listening on (\S+):(\d+)")
"""What the server prints once it accepts calls (server/cli.py), with its host and real port."""
DASHBOARD = re.compile(r"dashboard on (\S+)")
"""What the server prints, before LISTENING, once its web dashboard serves: the page's URL."""

# argv[1] is the parent's pid, to catch a parent that died before the prctl.
# Set in the child itself: preexec_fn is unsafe in a parent with threads.
_SERVE_DYING_WITH_PARENT = """
import ctypes, os, signal, sys
if sys.platform == "linux":
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv.pop(1)):
    sys.exit("fedrl-server: the process that started it is gone")
from fedrl.server.cli import main
main()
"""


class ServerStartError(RuntimeError):
    """The server exited, or did not listen in time; the message holds its output."""


class ServerProcess:
    """One `fedrl-server serve` child on a data dir; restartable there after kill or stop."""

    def __init__(
        self,
        data_dir: Path,
        *options: str,
        port: int = 0,
        log_level: str = "WARNING",
        log: Path | None = None,
        new_session: bool = False,
    ) -> None:
        """`options` are more `fedrl-server serve` options ("--buffer-size", "2", ...).

        The dashboard gets any free port (a fixed one would collide between
        servers started side by side); `--no-dashboard` in `options` turns it
        off. A fixed `port` keeps the address across restarts. `log` receives the
        server's output instead of memory (a long run at INFO). `new_session`
        puts the child in a session of its own, so a Ctrl-C in the terminal
        reaches only the parent, which then stops the server once.
        """
        self.data_dir = data_dir
        self.options = list(options)
        self.host = "127.0.0.1"
        self.port = port
        self.output: list[str] = []
        """The server's output lines, when no log file was given."""
        self.dashboard_url = ""
        """The web dashboard's URL once started ("" with --no-dashboard)."""
        self._requested_port = port
        self._log_level = log_level
        self._log_path = log
        self._new_session = new_session
        self._process: subprocess.Popen[str] | None = None

    @property
    def address(self) -> str:
        """host:port to dial, once started."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the server is not started")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 60.0) -> Self:
        """Start the server and wait for its "listening" line, which gives the real port."""
        command = [
            sys.executable,
            "-c",
            _SERVE_DYING_WITH_PARENT,
            str(os.getpid()),
            "serve",
            "--port",
            str(self._requested_port),
            "--data-dir",
            str(self.data_dir),
            "--log-level",
            self._log_level,
            "--dashboard-port",
            "0",
            *self.options,
        ]
        self._process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=self._new_session,
        )
        listening = threading.Event()
        settled = threading.Event()
        threading.Thread(
            target=self._read_output,
            args=(self._process, listening, settled),
            name="fedrl-server-output",
            daemon=True,
        ).start()
        settled.wait(timeout_s)
        if not listening.is_set():
            self.kill()
            where = self._log_path or "".join(self.output)
            raise ServerStartError(f"fedrl-server did not start; its output: {where}")
        return self

    def _read_output(
        self, process: subprocess.Popen[str], listening: threading.Event, settled: threading.Event
    ) -> None:
        """Keep the server's output (it must never block on a full pipe); note its port."""
        assert process.stdout is not None
        log: TextIO | None = None
        if self._log_path is not None:
            log = self._log_path.open("a", encoding="utf-8")
        try:
            for line in process.stdout:
                if log is None:
                    self.output.append(line)
                else:
                    log.write(line)
                    log.flush()
                dashboard = DASHBOARD.search(line)
                if dashboard:
                    self.dashboard_url = dashboard[1]
                match = LISTENING.search(line)
                if match and not listening.is_set():
                    self.host, self.port = match[1], int(match[2])
                    listening.set()
                    settled.set()
        finally:
            settled.set()
            if log is not None:
                log.close()

    def send_signal(self, signum: int) -> None:
        """Signal the server (SIGSTOP, SIGCONT: a server that stops answering for a while)."""
        if self._process is None:
            raise RuntimeError("the server is not started")
        self._process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to flush anything."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=30)
        self._process = None

    def stop(self, grace_s: float = 60.0) -> int | None:
        """SIGTERM, the graceful path; SIGKILL after grace_s. The exit status (None: never started).

        0 is a clean shutdown: in-flight calls answered, the update buffer
        folded into a last version, the database closed.
        """
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait(timeout=30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
