"""Faults under load, bench/faults.py's short form: exactly once through kills and a bad network.

The bench is run as a script (8 participants, 20 s, the server SIGKILLed
twice, every connection through its delaying, blackholing and cutting proxy)
and its figures are checked: every acknowledged update is applied exactly
once, nothing a participant was told is stored is missing, no call was
refused for anything but the transport.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "faults.py"


@pytest.mark.slow
def test_updates_survive_kills_and_a_hostile_network_exactly_once(tmp_path: Path) -> None:
    finished = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--participants",
            "8",
            "--duration",
            "20",
            "--restarts",
            "2",
            "--work-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    figures = json.loads(finished.stdout.strip().splitlines()[-1])

    assert len(figures["kills_at_s"]) == 2
    assert figures["server_exit_status"] == 0
    assert figures["updates_acknowledged"] > 0
    assert figures["updates_applied"] == figures["updates_acknowledged"]
    assert figures["acknowledged_and_applied"] == figures["updates_acknowledged"]
    assert (figures["doubled"], figures["lost"], figures["refused"]) == (0, 0, 0)
    assert (figures["non_integer_coordinates"], figures["quarantined"]) == (0, 0)
    assert figures["server_acks_pending"] == 0
    assert figures["experience_lost"] == 0
    assert figures["experience_stored"] == figures["experience_acknowledged"]
    assert figures["proxy"]["cut"] > 0 and figures["proxy"]["delayed"] > 0
