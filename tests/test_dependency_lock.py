"""requirements.lock pins every distribution `make install` puts into the project's venv."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def public(version: str) -> str:
    """The version without its local label: the lock's torch==2.13.0 is the CPU build's
    2.13.0+cpu here and the registry's build elsewhere."""
    return version.split("+", 1)[0]


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        match = PIN.match(line)
        if match:
            pins[normalise(match.group(1))] = match.group(2)
    return pins


def test_the_lock_pins_torch_to_the_project_version_and_no_cuda_package() -> None:
    pins = lock_pins()
    assert pins["torch"] == "2.13.0"
    assert not [name for name in pins if name.startswith("nvidia-") and name != "nvidia-ml-py"]


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
    reason="checks the venv `make install` builds; this interpreter is another",
)
def test_every_installed_distribution_is_the_locked_version() -> None:
    pins = lock_pins()
    installed = {
        normalise(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions()
        if d.metadata["Name"]
    }
    installed.pop("fedrl")
    unlocked = sorted(name for name in installed if name not in pins)
    assert not unlocked, f"installed but not in requirements.lock: {unlocked}"
    moved = {
        name: (version, pins[name])
        for name, version in installed.items()
        if public(version) != public(pins[name])
    }
    assert not moved, f"installed (left) differs from requirements.lock (right): {moved}"
