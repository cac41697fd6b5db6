"""Collect every wheel fedrl needs, torch aside, so a machine without internet can install it.

GPU nodes often reach no package index and bring their own CUDA build of
torch. This fills a folder with the wheels of every distribution fedrl and
the chosen extras need, at the versions requirements.lock pins, for Linux
x86-64 and each CPython asked for, plus fedrl's own wheel and its build
backend's (setuptools, wheel: enough to install a source tree as well). On
such a node:

    pip install --no-index --find-links wheelhouse 'fedrl[atari]'

What is needed is read from the installed distributions' own metadata
(`Requires-Dist`, markers evaluated for each target Python), starting at
fedrl's requirements and never descending into torch: the wheelhouse holds
what the node lacks, and the node's torch brings its own dependencies.

    .venv/bin/python scripts/wheelhouse.py [--out wheelhouse] [--python 3.11 --python 3.12]
        [--extras atari,plot,video,export,trading] [--list]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
BROUGHT_BY_THE_NODE = frozenset({"torch"})
"""Distributions a GPU node brings (its own CUDA build), and so everything under them."""
BUILD_BACKEND = ("setuptools", "wheel")
"""What installing fedrl from a source tree needs besides its dependencies."""
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)
"""pip matches a wheel's platform tag exactly: every tag a Linux x86-64 wheel of ours carries."""
DEFAULT_EXTRAS = "atari,plot,video,export,trading"
"""What `make install` installs beside the development tools."""


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(lock: Path = LOCK) -> dict[str, str]:
    """requirements.lock's pins, by normalised name."""
    pins = {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
        if match:
            pins[normalise(match.group(1))] = match.group(2)
    return pins


def _environment(python: str, extra: str) -> dict[str, str]:
    """Marker variables of CPython `python` (e.g. "3.12") on Linux x86-64."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": extra,
    }


def needed(python: str, extras: list[str]) -> list[str]:
    """Normalised names of every distribution fedrl[extras] needs on CPython `python`, torch
    and what only torch needs aside, read from the installed distributions' metadata."""
    fedrl = importlib.metadata.distribution("fedrl")
    todo = [
        requirement
        for requirement in (Requirement(r) for r in fedrl.requires or [])
        if _applies(requirement, python, ["", *extras])
    ]
    found: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = normalise(requirement.name)
        if name in found or name in BROUGHT_BY_THE_NODE or name == "fedrl":
            continue
        found.add(name)
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError as error:
            raise SystemExit(
                f"{name} is needed on Python {python} but not installed here, so its "
                "dependencies are unknown: add it to requirements.lock (`make lock`)"
            ) from error
        wanted = ["", *sorted(requirement.extras)]
        todo += [
            r
            for r in (Requirement(line) for line in distribution.requires or [])
            if _applies(r, python, wanted)
        ]
    return sorted(found)


def _applies(requirement: Requirement, python: str, extras: list[str]) -> bool:
    marker: Marker | None = requirement.marker
    if marker is None:
        return True
    return any(marker.evaluate(_environment(python, extra)) for extra in extras)


def pinned(names: list[str], pins: dict[str, str]) -> list[str]:
    """`name==version` for each name, from the lock; SystemExit naming any the lock misses."""
    missing = [name for name in names if name not in pins]
    if missing:
        raise SystemExit(f"requirements.lock pins none of {missing}: run `make lock`")
    return [f"{name}=={pins[name]}" for name in names]


def download(requirements: list[str], python: str, out: Path) -> None:
    """The wheels of `requirements` (no dependencies: the list is whole) for CPython `python`."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python,
        *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
        "--dest",
        str(out),
        *requirements,
    ]
    print(f"wheelhouse: {len(requirements)} distributions for CPython {python}", flush=True)
    subprocess.run(command, check=True)


def build_fedrl(out: Path) -> None:
    """fedrl's own wheel from this tree (pure Python: one wheel serves every Python)."""
    print("wheelhouse: fedrl's own wheel", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--wheel-dir",
                str(out),
                str(ROOT),
            ],
            check=True,
            cwd=scratch,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument(
        "--python", action="append", default=None, help="CPython X.Y (repeat; 3.11 and 3.12)"
    )
    parser.add_argument("--extras", default=DEFAULT_EXTRAS, help="fedrl's extras to include")
    parser.add_argument("--list", action="store_true", help="print the pins; download nothing")
    args = parser.parse_args()
    pythons = args.python or ["3.11", "3.12"]
    extras = [e for e in args.extras.split(",") if e]
    pins = lock_pins()
    wanted = {
        python: pinned(sorted({*needed(python, extras), *BUILD_BACKEND}), pins)
        for python in pythons
    }
    if args.list:
        for python, requirements in wanted.items():
            print(f"# CPython {python}")
            print("\n".join(requirements))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for python, requirements in wanted.items():
        download(requirements, python, args.out)
        # What an install beside a node's own torch takes, exactly (make bench-gpu).
        listing = args.out / f"requirements-{python}.txt"
        listing.write_text("\n".join(requirements) + "\n", encoding="utf-8")
    build_fedrl(args.out)
    wheels = sorted(args.out.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print(f"wheelhouse: {len(wheels)} wheels, {size / 2**20:.0f} MiB in {args.out}")


if __name__ == "__main__":
    main()
