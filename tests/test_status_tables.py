"""Status tables of a real server's state line up in a terminal whatever the participant ids.

The check here counts terminal cells on its own (east-asian width, combining
marks) instead of asking status_table.display_width, so a wrong width rule
there shows up as a misaligned column here.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator

import numpy as np
import pytest

from fedrl.common.status_table import render_status
from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.server_harness import (
    InProcessServer,
    join,
    make_spec,
    push,
    seed,
    server_config,
    wait_for_version,
)

SPEC = make_spec([(4,)])
# Cyrillic, CJK (two cells a character), and a combining mark with no
# precomposed form (q + dot above stays two code points after NFC: one cell).
PARTICIPANTS = {"Макар": 7, "小明": 12, "q\u0307uinn": 3, "bob": 100}


def terminal_cells(text: str) -> list[str]:
    """One entry per terminal cell: a wide character fills two, a combining mark none."""
    cells: list[str] = []
    for char in text:
        if unicodedata.combining(char):
            cells[-1] += char
        elif unicodedata.east_asian_width(char) in ("W", "F"):
            cells += [char, ""]
        else:
            cells.append(char)
    return cells


def table_blocks(text: str) -> Iterator[list[str]]:
    """Each table of the output: header line, dash line, rows."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if index and line and set(line.replace(" ", "")) == {"-"}:
            end = lines.index("", index) if "" in lines[index:] else len(lines)
            yield lines[index - 1 : end]


def columns(block: list[str]) -> list[list[str]]:
    """Every row cut at the column spans the dash line draws, stripped."""
    dash = block[1]
    spans, start = [], None
    for position, char in enumerate(dash + " "):
        if char == "-" and start is None:
            start = position
        elif char != "-" and start is not None:
            spans.append((start, position))
            start = None
    rows = []
    for line in [block[0], *block[2:]]:
        cells = terminal_cells(line)
        for _, right in spans:
            # Two spaces separate columns, so a misaligned row puts text here.
            assert "".join(cells[right : right + 2]).strip() == "", (
                f"text in the gap after a column: {line!r}"
            )
        rows.append(["".join(cells[a:b]).strip() for a, b in spans])
    return rows


@pytest.fixture(scope="module")
def status(tmp_path_factory: pytest.TempPathFactory) -> pb.StatusReply:
    """A real server's status after every participant pushed: ids, counts, versions."""
    data = tmp_path_factory.mktemp("server") / "data"
    with InProcessServer(server_config(data, buffer_size=2)) as server:
        stub = server.stub()
        for pid in PARTICIPANTS:
            join(stub, pid, SPEC)
        seed(stub, "Макар", SPEC, [np.zeros(4, np.float32)])
        for pid, episodes in PARTICIPANTS.items():
            push(
                stub,
                pid,
                SPEC,
                [np.full(4, 0.5, np.float32)],
                sequence=1,
                base_version=0,
                episodes=episodes,
                metrics=pb.UpdateMetrics(mean_return=float(episodes), eval_return=2.0 * episodes),
            )
        # Aggregation is asynchronous: wait until both buffers of two became versions.
        wait_for_version(stub, 2)
        reply: pb.StatusReply = stub.Status(pb.StatusRequest(), timeout=30)
        return reply


def test_participant_table_columns_line_up_for_unicode_ids(status: pb.StatusReply) -> None:
    text = render_status(status)

    participants = next(b for b in table_blocks(text) if b[0].startswith("participant"))
    rows = columns(participants)

    assert rows[0][:3] == ["participant", "status", "episodes"]
    by_id = {row[0]: row for row in rows[1:]}
    assert set(by_id) == set(PARTICIPANTS)
    for pid, episodes in PARTICIPANTS.items():
        assert by_id[pid][1] == "active"
        assert by_id[pid][2] == str(episodes)
        assert by_id[pid][7] == f"{2.0 * episodes:.2f}"  # best eval, far right of the id


def test_numeric_columns_are_right_aligned(status: pb.StatusReply) -> None:
    text = render_status(status)

    participants = next(b for b in table_blocks(text) if b[0].startswith("participant"))
    header = participants[0]
    episodes_end = len(terminal_cells(header[: header.index("episodes") + len("episodes")]))
    for line in participants[2:]:
        cells = terminal_cells(line)
        assert cells[episodes_end - 1].isdigit()  # the last digit sits under the header's end
        assert cells[episodes_end] == " "


def test_version_table_lists_unicode_contributors_aligned(status: pb.StatusReply) -> None:
    text = render_status(status)

    versions = next(b for b in table_blocks(text) if b[0].startswith("version"))
    rows = columns(versions)

    header, body = rows[0], rows[1:]
    contributors = header.index("contributors")
    checkpoint = header.index("checkpoint")
    listed = {c for row in body for c in row[contributors].split(", ") if c != "-"}
    assert listed == set(PARTICIPANTS)
    assert all(row[checkpoint].endswith(".npz") or row[checkpoint] == "(pruned)" for row in body)


def test_summary_names_goal_progress_best_model_and_active_participants(
    status: pb.StatusReply,
) -> None:
    text = render_status(status)

    session = status.sessions[0]
    assert f"{sum(PARTICIPANTS.values())}/{session.goal.total_episodes} episodes" in text
    assert f"{len(PARTICIPANTS)} of {len(PARTICIPANTS)} participants" in text
    assert "best eval" in text
