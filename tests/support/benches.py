"""Benches are scripts, not package modules: tests load them from their files.

Loading the file itself means the tests check exactly the functions a
bench prints its figures with.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parent.parent.parent / "bench"


def load_bench(file_name: str, module_name: str) -> ModuleType:
    """bench/`file_name` as a module registered under `module_name`."""
    spec = importlib.util.spec_from_file_location(module_name, BENCH_DIR / file_name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Dataclasses resolve their annotations through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
