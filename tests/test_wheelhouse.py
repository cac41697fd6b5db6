"""`make wheelhouse`: everything fedrl needs but torch installs with no index.

The fast test resolves the wheelhouse's list in a clean virtual environment
against stand-in wheels (the lock's names and versions, each with its real
dependencies), so a distribution the list misses fails the resolve without
any download. The slow one downloads the real wheelhouse for this Python and
installs fedrl from it, with no index, in a clean virtual environment.
Both give torch as a stand-in wheel: a GPU node brings its own.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def wheelhouse() -> ModuleType:
    """scripts/wheelhouse.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location(
        "fedrl_wheelhouse", ROOT / "scripts" / "wheelhouse.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stand_in_wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    """A wheel with `name`'s metadata and no code: enough for pip to resolve with."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    files = {
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    records = []
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            data = text.encode()
            archive.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            records.append(f"{path},sha256={digest.decode()},{len(data)}")
        archive.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")


def clean_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def test_the_wheelhouse_lists_what_fedrl_needs_and_not_torch(wheelhouse: ModuleType) -> None:
    for python in ("3.11", "3.12"):
        names = wheelhouse.needed(python, ["atari"])

        assert {"grpcio", "protobuf", "numpy", "gymnasium", "ale-py", "cryptography"} <= set(names)
        assert "torch" not in names and "sympy" not in names  # sympy: only torch needs it
        assert "pytest" not in names  # development tools stay out
        wheelhouse.pinned(names, wheelhouse.lock_pins())  # every one is in the lock


def test_the_wheelhouse_list_resolves_with_no_index_in_a_clean_venv(
    wheelhouse: ModuleType, tmp_path: Path
) -> None:
    # prepare: stand-ins for every listed distribution, fedrl's own, and the node's torch
    stand_ins = tmp_path / "stand-ins"
    stand_ins.mkdir()
    pins = wheelhouse.lock_pins()
    for requirement in wheelhouse.pinned(wheelhouse.needed(PYTHON, ["atari"]), pins):
        name, version = requirement.split("==")
        requires = importlib.metadata.distribution(name).requires or []
        stand_in_wheel(stand_ins, name, version, requires)
    stand_in_wheel(stand_ins, "torch", pins["torch"], [])
    stand_in_wheel(stand_ins, "fedrl", "0.1.0", importlib.metadata.requires("fedrl") or [])
    python = clean_venv(tmp_path / "venv")

    # act
    done = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "--isolated",  # this machine's pip settings (wheel folders, indexes) stay out
            "install",
            "--dry-run",
            "--quiet",
            "--no-index",
            "--find-links",
            str(stand_ins),
            "fedrl[atari]",
        ],
        capture_output=True,
        text=True,
        check=False,
    )

    # assert
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_a_wheelhouse_installs_fedrl_with_no_index_in_a_clean_venv(
    wheelhouse: ModuleType, tmp_path: Path
) -> None:
    # prepare: the real wheelhouse for this Python (downloads), and the node's torch
    house = tmp_path / "wheelhouse"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "wheelhouse.py"),
            "--out",
            str(house),
            "--python",
            PYTHON,
            "--extras",
            "atari",
        ],
        check=True,
    )
    node = tmp_path / "node"
    node.mkdir()
    stand_in_wheel(node, "torch", wheelhouse.lock_pins()["torch"], [])
    python = clean_venv(tmp_path / "venv")

    # act
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "--isolated",
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(house),
            "--find-links",
            str(node),
            "fedrl[atari]",
        ],
        check=True,
    )

    # assert: what does not need torch imports, and every dependency is whole
    code = "import fedrl.common.config_cli, grpc, gymnasium, ale_py, zstandard, aiohttp"
    subprocess.run([str(python), "-c", code], check=True)
    subprocess.run([str(python), "-m", "pip", "check"], check=True)
