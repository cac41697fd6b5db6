"""A real PostgreSQL server for the tests: initdb into a temp dir, pg_ctl start on a free port.

Debian's `postgresql` package (installed by `make postgres`, which `make test` runs) keeps its
programs in /usr/lib/postgresql/<version>/bin, off PATH; they are looked for there too. The
server refuses to run as root, so as root it runs as the package's `postgres` user. Where
neither works the tests that need it skip and say why.

Authentication is scram-sha-256 with a password, as on a hosted server, so a wrong password
is refused the way it would be there.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port

USER = "trader"
PASSWORD = "s3cret-pass"
DATABASE = "market"
_START_TRIES = 3


@dataclass(frozen=True)
class Postgres:
    """A running server: where it listens and who may log in."""

    host: str
    port: int
    user: str
    password: str
    database: str

    def url(self, database: str | None = None) -> str:
        """A libpq URL without the password (tests pass it through PGPASSWORD)."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database or self.database}"

    def conninfo(self) -> str:
        """A libpq connection string with the password, for the tests' own connections."""
        return (
            f"host={self.host} port={self.port} user={self.user} "
            f"password={self.password} dbname={self.database}"
        )


def find_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl: on PATH, or Debian's newest version."""
    on_path = shutil.which("initdb")
    if on_path is not None and shutil.which("pg_ctl") is not None:
        return Path(on_path).resolve().parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    return Path(found[-1]).parent if found else None


def unavailable_reason() -> str | None:
    """Why no server can be started here, or None when one can."""
    if find_binaries() is None:
        return (
            "no PostgreSQL server programs (initdb, pg_ctl): install Debian's postgresql "
            "package (`make postgres` does, as root with apt-get)"
        )
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    if os.geteuid() == 0:
        try:
            import pwd  # noqa: PLC0415  (POSIX only)

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    return None


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def running_postgres() -> Iterator[Postgres]:
    """A fresh server with database DATABASE owned by USER; stopped and removed on exit."""
    binaries = find_binaries()
    assert binaries is not None, unavailable_reason()
    root = Path(tempfile.mkdtemp(prefix="fedrl-pg-"))
    data, sockets = root / "data", root / "sockets"
    sockets.mkdir()
    password_file = root / "password"
    password_file.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
        shutil.chown(password_file, "postgres")
    try:
        _run(
            _as_server_user(
                [
                    str(binaries / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    USER,
                    "--pwfile",
                    str(password_file),
                    "--auth",
                    "scram-sha-256",
                    "--encoding",
                    "UTF8",
                    "--no-instructions",
                ]
            )
        )
        port = _start(binaries, data, sockets, root / "log")
        server = Postgres("127.0.0.1", port, USER, PASSWORD, DATABASE)
        try:
            import psycopg  # noqa: PLC0415

            with psycopg.connect(
                server.conninfo().replace(DATABASE, "postgres"), autocommit=True
            ) as c:
                c.execute(f"CREATE DATABASE {DATABASE}")
            yield server
        finally:
            _run(
                _as_server_user(
                    [str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]
                )
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _start(binaries: Path, data: Path, sockets: Path, log: Path) -> int:
    """Start on a free port; another process may take the port first, so try again."""
    if os.geteuid() == 0:
        log.touch()
        shutil.chown(log, "postgres")
    for attempt in range(_START_TRIES):
        port = free_port()
        options = (
            f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 "
            # A throwaway server: durability costs time and buys nothing here.
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        result = subprocess.run(
            _as_server_user(
                [
                    str(binaries / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(log),
                    "-w",
                    "-o",
                    options,
                    "start",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            return port
        if attempt == _START_TRIES - 1:
            raise RuntimeError(f"pg_ctl start failed: {result.stderr}\n{log.read_text()}")
    raise AssertionError("unreachable")


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stdout}{result.stderr}")
