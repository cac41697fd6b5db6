"""The shared-memory segments a test's own engines create, told apart from other processes'.

/dev/shm is shared by every process on the machine, the other test processes of a parallel
run included, so "no fedrl_ segment more than before" can fail on a segment another test is
still using. A test records the names its engines create and checks that those are gone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedrl.client.training import shm

SHM = Path("/dev/shm")


def record_created(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The names of the segments this process creates from now on; the set fills as it does."""
    created: set[str] = set()
    name_segment = shm._segment_name

    def recording(kind: str) -> str:
        name = name_segment(kind)
        created.add(name)
        return name

    monkeypatch.setattr(shm, "_segment_name", recording)
    return created


def still_there(names: set[str]) -> set[str]:
    """Those of `names` that are still in /dev/shm."""
    return {name for name in names if (SHM / name).exists()}
