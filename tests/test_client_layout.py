"""The participant's code stays in modules small enough to read: none in client/ over 700 lines."""

from __future__ import annotations

from pathlib import Path

CLIENT = Path(__file__).resolve().parents[1] / "client"
MAX_LINES = 700


def test_no_client_module_is_over_700_lines() -> None:
    # prepare
    modules = sorted(CLIENT.rglob("*.py"))

    # act
    sizes = {
        path.relative_to(CLIENT.parent): len(path.read_text("utf-8").splitlines())
        for path in modules
    }

    # assert
    assert modules, f"no Python modules found under {CLIENT}"
    too_long = {str(path): lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by job): {too_long}"
