"""The package holds together: generated code in sync, server free of torch, scripts installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_protocol_code_is_in_sync_with_the_proto_files() -> None:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
    assert spec and spec.loader
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)

    assert generate.differences() == []


def test_server_side_imports_no_torch() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import fedrl.server, fedrl.common\n"
        "for pkg in (fedrl.server, fedrl.common):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(bad[:3]); sys.exit(1 if bad else 0)\n"
    )

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, result.stdout + result.stderr


def test_console_scripts_print_help() -> None:
    bindir = Path(sys.executable).parent
    for script in ("fedrl-server", "fedrl-client"):
        result = subprocess.run(
            [str(bindir / script), "--help"], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        assert "Usage:" in result.stdout
