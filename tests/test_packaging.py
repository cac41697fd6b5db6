"""The package holds together: generated code in sync, server free of torch, scripts installed."""

from __future__ import annotations

import ast
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


def test_client_imports_nothing_from_the_server() -> None:
    # prepare: every import statement under client/, lazy ones in functions included
    written = []
    for path in sorted((ROOT / "client").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                written += [(path.name, node.module)]
            elif isinstance(node, ast.Import):
                written += [(path.name, alias.name) for alias in node.names]
    # ... and what importing every client module loads, through common/ or anywhere else
    code = (
        "import importlib, pkgutil, sys\n"
        "import fedrl.client\n"
        "for m in pkgutil.walk_packages(fedrl.client.__path__, 'fedrl.client.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('fedrl.server')))\n"
    )

    # act
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )

    # assert
    assert len(written) > 100, "the walk found the client's imports"
    assert [(f, m) for f, m in written if m.startswith(("fedrl.server", "server"))] == []
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_console_scripts_print_help() -> None:
    bindir = Path(sys.executable).parent
    for script in ("fedrl-server", "fedrl-client"):
        result = subprocess.run(
            [str(bindir / script), "--help"], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        assert "Usage:" in result.stdout
