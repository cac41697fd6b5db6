"""Status tables, `fedrl-server status` while serving, and the CLI <-> ServerConfig mapping."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedrl.common.config_help import FieldOption
from fedrl.common.status_file import read_status_file
from fedrl.common.status_table import display_width, render_status
from fedrl.proto.v1 import federation_pb2 as pb
from fedrl.server.app import run_server
from fedrl.server.cli import main, serve_command
from fedrl.server.config import ServerConfig
from fedrl.server.names import DB_FILE
from fedrl.server.security.auth import InsecureBindError
from fedrl.server.status.read_model import StatusView
from fedrl.server.storage.state_db import StateDB
from tests.support.server_harness import (
    InProcessServer,
    ServerProcess,
    channel,
    join,
    make_spec,
    push,
    seed,
    server_config,
)

SPEC = make_spec([(4,)])


def test_table_columns_line_up_for_cyrillic_and_wide_ids() -> None:
    reply = pb.StatusReply(
        sessions=[
            pb.SessionState(
                session="default",
                current_version=3,
                participants=[
                    pb.ParticipantState(participant_id=pid, status="active", episodes=episodes)
                    for pid, episodes in (("Макар", 5), ("小明", 12), ("bob", 100))
                ],
            )
        ]
    )

    text = render_status(reply)

    rows = [line for line in text.splitlines() if line.startswith(("Макар", "小明", "bob"))]
    status_columns = [display_width(row[: row.index("active")]) for row in rows]
    assert len(rows) == 3
    assert len(set(status_columns)) == 1


def test_display_width_counts_terminal_cells() -> None:
    assert display_width("Макар") == 5
    assert display_width("小明") == 4
    assert display_width("e\u0301") == 1  # e + combining acute accent


def test_status_command_reads_the_database_while_the_server_runs(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data", buffer_size=1)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "Макар", SPEC)
        seed(stub, "Макар", SPEC, [np.zeros(4, np.float32)])
        push(stub, "Макар", SPEC, [np.ones(4, np.float32)], sequence=1, base_version=0, episodes=4)

        result = CliRunner().invoke(main, ["status", "--data-dir", str(config.data_dir)])

    assert result.exit_code == 0, result.output
    assert "Макар" in result.output
    assert "4/1000 episodes" in result.output


def test_status_command_without_a_data_dir_says_where_it_looked(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["status", "--data-dir", str(tmp_path / "none")])

    assert result.exit_code != 0
    assert "no server state" in result.output


def test_every_config_field_has_exactly_one_serve_option_with_its_default() -> None:
    options = {
        param.name: param
        for param in serve_command.params
        # log_level is a process setting, not a server knob.
        if isinstance(param, FieldOption) and param.name != "log_level"
    }
    fields = {f.name: f for f in dataclasses.fields(ServerConfig)}

    assert set(options) == set(fields)
    for name, param in options.items():
        assert param.opts == ["--" + name.replace("_", "-")]
        assert param.default == getattr(ServerConfig(), name)
        assert param.help, f"option for {name} has no help"


def test_config_refuses_a_bad_setting_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="buffer_size"):
        ServerConfig(buffer_size=-1)
    with pytest.raises(ValueError, match="active_window_s"):
        ServerConfig(active_window_s=0.0)
    with pytest.raises(ValueError, match="strategy"):
        ServerConfig(strategy="mode")


def test_plaintext_on_a_non_loopback_address_is_refused(tmp_path: Path) -> None:
    config = server_config(tmp_path / "data", host="0.0.0.0")

    with pytest.raises(InsecureBindError, match=r"0\.0\.0\.0"):
        asyncio.run(run_server(config))


def test_serve_command_reports_a_refused_address_as_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["serve", "--host", "192.0.2.1", "--data-dir", str(tmp_path / "data")]
    )

    assert result.exit_code == 2
    assert "refusing to serve plaintext" in result.output


def test_served_process_offers_federation_and_experience_exchange(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as server, channel(server.address) as opened:
        check = health_pb2_grpc.HealthStub(opened).Check
        statuses = {
            name: check(health_pb2.HealthCheckRequest(service=name), timeout=30).status
            for name in ("fedrl.v1.Federation", "fedrl.v1.ExperienceExchange")
        }

    assert set(statuses.values()) == {health_pb2.HealthCheckResponse.SERVING}


def test_bare_command_help_shows_the_serve_options() -> None:
    result = CliRunner().invoke(main, ["--help-all"])

    assert result.exit_code == 0
    for option in ("--data-dir", "--port", "--session-strategy", "--token-auth", "--log-level"):
        assert option in result.output


def test_bare_command_takes_the_serve_options(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--host", "192.0.2.1", "--data-dir", str(tmp_path / "d")])

    assert result.exit_code == 2
    assert "refusing to serve plaintext" in result.output


def test_bare_command_serves_on_the_data_dir_it_is_given(tmp_path: Path) -> None:
    # prepare
    data = tmp_path / "fedrl-server-data"
    command = [sys.executable, "-c", "from fedrl.server.cli import main; main()"]

    # act: `fedrl-server --data-dir fedrl-server-data`, as the README has it
    with subprocess.Popen(
        [*command, "--data-dir", str(data), "--port", "0", "--dashboard-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as process:
        try:
            # The dashboard's line comes first; the listening line is the last one at start.
            announced = next((line for line in process.stdout or () if "listening on" in line), "")
            stored = (data / "state.sqlite3").exists()
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)

    # assert
    assert announced.startswith("fedrl-server listening on 127.0.0.1:"), announced
    assert f"(data in {data})" in announced
    assert stored
    assert code == 0


def test_serve_options_before_a_command_are_refused_not_ignored(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--port", "1", "status", "--data-dir", str(tmp_path)])

    assert result.exit_code == 2
    assert "--port before `status`" in result.output


def status_once_made(stub: Any, version: int) -> pb.StatusReply:
    """Aggregation is asynchronous: the status once `version` is committed."""
    deadline = time.monotonic() + 60
    while True:
        reply = stub.Status(pb.StatusRequest(max_versions=100), timeout=30)
        if reply.sessions[0].current_version >= version:
            return reply  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"version {version} was never made"
        time.sleep(0.05)


def test_status_as_json_lists_every_version_for_the_plot(tmp_path: Path) -> None:
    # prepare
    config = server_config(tmp_path / "data", buffer_size=1)
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "Макар", SPEC)
        seed(stub, "Макар", SPEC, [np.zeros(4, np.float32)])
        for sequence in range(1, 4):
            push(stub, "Макар", SPEC, [np.ones(4, np.float32)], sequence=sequence, base_version=0)
        served = status_once_made(stub, 3)

        # act
        runs = {
            versions: CliRunner().invoke(
                main,
                ["status", "--data-dir", str(config.data_dir), "--versions", versions, "--json"],
            )
            for versions in ("0", "2")
        }

    # assert
    listed = {}
    for versions, result in runs.items():
        assert result.exit_code == 0, result.output
        path = tmp_path / f"status-{versions}.json"
        path.write_text(result.stdout, encoding="utf-8")
        listed[versions] = [v.version for v in read_status_file(path).sessions[0].versions]
    assert listed["0"] == [v.version for v in served.sessions[0].versions] == [3, 2, 1, 0]
    assert listed["2"] == [3, 2]


def test_each_version_counts_the_env_steps_folded_into_it_and_its_ancestors(
    tmp_path: Path,
) -> None:
    config = server_config(tmp_path / "data", buffer_size=1)
    seen = []
    with InProcessServer(config) as server:
        stub = server.stub()
        join(stub, "Макар", SPEC)
        seed(stub, "Макар", SPEC, [np.zeros(4, np.float32)])
        # Status read after each version: the sums are kept between reads.
        for sequence, steps in ((1, 100), (2, 250)):
            push(
                stub, "Макар", SPEC, [np.ones(4, np.float32)],
                sequence=sequence, base_version=0, env_steps=steps,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while stub.Status(pb.StatusRequest()).sessions[0].current_version < sequence:
                assert time.monotonic() < deadline, f"no version {sequence} within a minute"
                time.sleep(0.05)
            versions = stub.Status(pb.StatusRequest()).sessions[0].versions
            seen.append([(v.version, v.env_steps) for v in versions])
    db = StateDB(config.data_dir / DB_FILE, read_only=True)
    reread = StatusView(db).read(None, 10, 0)
    db.close()

    assert seen == [[(1, 100), (0, 0)], [(2, 350), (1, 100), (0, 0)]]
    assert [(v.version, v.env_steps) for v in reread.sessions[0].versions] == seen[-1]
