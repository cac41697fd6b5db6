"""Which tree a bench's figures come from: the checkout's commit and whether it had changes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]


def commit() -> dict[str, Any]:
    """{"commit": HEAD, "modified": tracked files changed}, both None where git cannot say."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPOSITORY), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "-C", str(REPOSITORY), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "modified": None}
    return {"commit": head, "modified": bool(changes)}
