"""common.durable_files: old or new after any failure, private modes, overlapping writers."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fedrl.common.durable_files import remove_abandoned_temp_files, replacing, write_atomically

DEAD_PID = 2**22 + 12345  # above Linux's pid_max: no process has it


def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")

    write_atomically(target, lambda file: file.write(b"new"))

    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")

    def fail(file: object) -> None:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_atomically(target, fail)

    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_private_file_is_owner_only_even_over_a_wider_leftover(tmp_path: Path) -> None:
    target = tmp_path / "server.key"
    leftover = tmp_path / ".server.key.tmp"
    leftover.write_bytes(b"half a key")
    leftover.chmod(0o644)
    seen: list[int] = []

    def write(file: object) -> None:
        seen.append(stat.S_IMODE(os.stat(tmp_path / ".server.key.tmp").st_mode))

    write_atomically(target, write, mode=0o600)

    assert seen == [0o600]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_writer_by_name_is_checked_before_its_file_takes_the_place(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"the good one")

    with pytest.raises(ValueError, match="check failed"), replacing(target) as temp:
        temp.write_bytes(b"a bad export")
        raise ValueError("check failed")
    with replacing(target) as temp:
        temp.write_bytes(b"a good export")

    assert target.read_bytes() == b"a good export"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_overlapping_writers_of_one_path_each_leave_a_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "global_state.json"
    contents = [bytes([65 + i]) * 100_000 for i in range(8)]
    start = threading.Barrier(len(contents))

    def write(content: bytes) -> None:
        start.wait()
        write_atomically(target, lambda file: file.write(content), unique=True)

    threads = [threading.Thread(target=write, args=(c,)) for c in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert target.read_bytes() in contents
    assert [p.name for p in tmp_path.iterdir()] == ["global_state.json"]


def test_leftovers_of_dead_writers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = tmp_path / f".v00000002.npz.{DEAD_PID}.0123abcd.tmp"
        alive = tmp_path / f".v00000003.npz.{writer.pid}.0123abcd.tmp"
        ours_abandoned = tmp_path / f".v00000004.npz.{os.getpid()}.0123abcd.tmp"
        other_target = tmp_path / f".notes.txt.{DEAD_PID}.0123abcd.tmp"
        for path in (dead, alive, ours_abandoned, other_target):
            path.write_bytes(b"half")

        remove_abandoned_temp_files(tmp_path, re.compile(r"v\d{8,}\.npz"))

        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other_target.name])
    finally:
        writer.kill()
        writer.wait()


def test_a_write_under_way_in_this_process_is_not_a_leftover(tmp_path: Path) -> None:
    target = tmp_path / "v00000001.npz"
    listed: list[list[str]] = []

    def write(file: object) -> None:
        remove_abandoned_temp_files(tmp_path, re.compile(r"v\d{8,}\.npz"))
        listed.append([p.name for p in tmp_path.iterdir()])

    write_atomically(target, write, unique=True)

    assert len(listed[0]) == 1 and listed[0][0].startswith(".v00000001.npz.")
    assert target.exists()
