"""The demo's reference figures are the ones docs/benchmarks.md's federation table holds."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def demo() -> ModuleType:
    """scripts/demo.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location("fedrl_demo", ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def federation_section() -> str:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    start = text.index("\n## Federation\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_demo_quotes_the_pair_and_the_lone_learner_of_the_federation_table() -> None:
    module = demo()
    section = federation_section()

    rows = {
        name: re.search(rf"^\| {re.escape(name)} \| [^|]* \| [^|]* \| ([\d,]+) \[", section, re.M)
        for name in ("group of 2, global model", "lone learner, defaults (replay ratio 0.5)")
    }

    assert all(rows.values()), rows
    pair, lone = (int(m.group(1).replace(",", "")) for m in rows.values() if m)
    assert (pair, lone) == (module.PAIR_IQM_STEPS, module.LONE_IQM_STEPS)
    assert f"seeds {module.REFERENCE_SEEDS}" in module.reference_line()
    assert f"{pair:,}" in module.reference_line() and f"{lone:,}" in module.reference_line()
