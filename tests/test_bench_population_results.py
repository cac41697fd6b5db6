"""bench.population's --results file: a resumed invocation takes only jobs of its own tree and
settings."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.population.cli import finished_jobs, provenance
from bench.population.settings import TASKS, Settings

SETTINGS = Settings(task=TASKS["CartPole-v1"], seeds=(0, 1), sizes=(4,))
MEMBER = {
    "name": "m0",
    "steps_to_target": 12_000,
    "final_eval": 500.0,
    "evaluations": [[2_000, 20.0], [12_000, 500.0]],
    "exploits": 1,
    "cpu_s": 30.0,
}


def clean(**changes: Any) -> dict[str, Any]:
    """The provenance of SETTINGS at a committed tree, with `changes`."""
    return provenance(SETTINGS) | {"commit": "a" * 40, "modified": False} | changes


def results(tmp_path: Path, *lines: dict[str, Any] | str) -> Path:
    path = tmp_path / "results.jsonl"
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
        encoding="utf-8",
    )
    return path


def record(seed: int, arm: str, ran: dict[str, Any] | None) -> dict[str, Any]:
    line: dict[str, Any] = {"seed": seed, "arm": arm, "members": [MEMBER]}
    if ran is not None:
        line["provenance"] = ran
    return line


def test_jobs_of_the_same_tree_and_settings_resume(tmp_path: Path) -> None:
    path = results(
        tmp_path,
        record(0, "population 4", clean()),
        record(0, "independent", clean()),
        record(0, "independent", clean()),
    )
    done = finished_jobs(path, clean())
    assert sorted(done) == [(0, "independent"), (0, "population 4")]
    assert len(done[(0, "independent")]) == 2
    assert done[(0, "population 4")][0].steps_to_target == 12_000


def test_a_job_of_another_commit_is_refused_naming_both(tmp_path: Path) -> None:
    path = results(tmp_path, record(0, "default", clean(commit="b" * 40)))
    named = re.escape(f"results.jsonl:1 ran with commit '{'b' * 40}' (now '{'a' * 40}')")
    with pytest.raises(SystemExit, match=named):
        finished_jobs(path, clean())


def test_a_job_of_other_settings_is_refused(tmp_path: Path) -> None:
    other = clean(task={**clean()["task"], "steps": 10_000})
    path = results(tmp_path, record(0, "default", clean()), record(1, "default", other))
    with pytest.raises(SystemExit, match=r"results\.jsonl:2 ran with task"):
        finished_jobs(path, clean())


@pytest.mark.parametrize("side", ["file", "checkout"])
def test_a_modified_tree_never_resumes(tmp_path: Path, side: str) -> None:
    modified = clean(modified=True)
    path = results(tmp_path, record(0, "default", modified if side == "file" else clean()))
    with pytest.raises(SystemExit, match="uncommitted changes"):
        finished_jobs(path, clean() if side == "file" else modified)


def test_a_line_without_provenance_or_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no record of its commit"):
        finished_jobs(results(tmp_path, record(0, "default", None)), clean())
    with pytest.raises(SystemExit, match=r"results\.jsonl:2 is no JSON line"):
        finished_jobs(results(tmp_path, record(0, "default", clean()), "{truncated"), clean())
