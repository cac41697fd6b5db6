"""The dashboard in a real browser: Debian's headless Chromium, driven through Selenium.

A real `fedrl-server` with two `fedrl-client` participants training CartPole
on tiny budgets, and a second session whose participant id and env id look
like markup. The page must show what the Status RPC says, take in new
versions without a reload, and show every id as text.

Skipped, saying why, where Chromium or its driver is missing (`make test`
installs Debian's `chromium` and `chromium-driver` where it runs as root
with apt-get).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fedrl.proto.v1 import federation_pb2 as pb
from tests.support.server_harness import ServerProcess, join, make_spec

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed: make install (the dev extra) adds it"
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no headless browser: install Debian's chromium and chromium-driver "
    "(`make test` does so when it runs as root with apt-get)",
)

CLIENT = [sys.executable, "-c", "from fedrl.client.commands.cli import main; main()"]
# Trains until the test has seen what it needs and stops it (SIGTERM: push,
# save, leave); the step cap only ends a run that the test never stops. The
# session's goal is raised out of reach: the default 1,000 episodes took two
# such trainers ~5 s, and a SIGTERM that finds a trainer already past its
# run, exiting, kills it with -15 instead of stopping it.
TINY = [
    "--episodes", "100000",
    "--total-episodes", "100000000",
    "--max-env-steps", "30000",
    "--sync-interval", "2",
    "--workers", "0",
    "--envs-per-worker", "4",
    "--steps-per-slot", "4",
    "--learning-starts", "100",
    "--hidden", "16",
    "--batch-size", "8",
    "--eval-interval", "300",
    "--eval-episodes", "2",
]  # fmt: skip
TRAINERS = ("Макар", "李雷")
# Ids may not hold < or > (they name directories), so markup-like text that
# is still a valid id; env ids are free text, so a real tag there.
ODD_ID = "&lt;script&gt;x&amp;"
ODD_SESSION = "lab & 'co'"
ODD_ENV = '<img src="x" onerror="window.pwned=1"><script>window.pwned=2</script>'
WAIT_S = 180.0
T = TypeVar("T")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--window-size=1280,2400", f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def start_trainer(address: str, pid: str, tmp_path: Path) -> subprocess.Popen[str]:
    log = (tmp_path / f"{pid}.log").open("w", encoding="utf-8")
    return subprocess.Popen(
        [*CLIENT, "--participant-id", pid, "--server", address,
         "--state-dir", str(tmp_path / "state"), *TINY],
        stdout=log, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def eventually(probe: Callable[[], T | None], what: str, timeout: float = WAIT_S) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None and found is not False:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


# The page redraws every poll, replacing its elements, so each read runs as one
# script in the page: it sees one drawing, never half of two.
_SECTION = """
const section = [...document.querySelectorAll("section.session")]
  .find((s) => s.querySelector("h2 .name").textContent === arguments[0]);
if (!section) return null;
"""
_PARTICIPANTS = (
    _SECTION
    + """
return [...section.querySelectorAll("table.participants tbody tr[data-participant]")].map((row) => {
  const cells = [...row.querySelectorAll("td")];
  return [row.querySelector("th").textContent, ...cells.slice(0, 5).map((c) => c.textContent),
          row.querySelector("td.seen").dataset.value, row.querySelector("td.data").textContent];
});
"""
)
_CURVE = (
    _SECTION
    + """
return [...section.querySelectorAll(`svg .series.${arguments[1]} circle`)].map((point) =>
  [point.dataset.version, point.dataset.envSteps, point.dataset.value]);
"""
)
_NEWEST = (
    _SECTION
    + """
const shown = [...section.querySelectorAll("table.versions tr[data-version]")];
return shown.length ? Math.max(...shown.map((row) => Number(row.dataset.version))) : null;
"""
)
_HEADER = (
    _SECTION
    + """
return [section.querySelector("table.participants tbody th").textContent,
        section.querySelector("h2 .env").textContent];
"""
)


def page_participants(driver: Any, session: str) -> list[tuple[str, ...]] | None:
    """Each participant row as shown: id, status, the counts, and last seen (ms)."""
    rows = driver.execute_script(_PARTICIPANTS, session)
    return None if rows is None else [tuple(row) for row in rows]


def rpc_participants(state: pb.SessionState) -> list[tuple[str, ...]]:
    return [
        (
            p.participant_id,
            p.status,
            f"{p.episodes:,}",
            f"{p.env_steps:,}",
            f"{p.updates_accepted:,}",
            f"{p.updates_rejected:,}",
            str(p.last_seen_unix_ms),
            f"SYNTHETIC DATA {p.data_source}" if p.synthetic_data else p.data_source,
        )
        for p in state.participants
    ]


def page_curve(driver: Any, session: str, series: str) -> list[tuple[int, int, float]]:
    """(version, env steps, value) of each point the page drew for a series."""
    points = driver.execute_script(_CURVE, session, series) or []
    return [(int(v), int(steps), float(value)) for v, steps, value in points]


def rpc_curve(state: pb.SessionState, field: str) -> list[tuple[int, int, float]]:
    return [
        (v.version, v.env_steps, getattr(v, field))
        for v in reversed(state.versions)
        if v.HasField(field)
    ]


def newest_version_shown(driver: Any) -> int | None:
    newest = driver.execute_script(_NEWEST, "default")
    return None if newest is None else int(newest)


def test_the_page_shows_what_status_says_updates_live_and_shows_ids_as_text(
    tmp_path: Path, browser: Any, trainers: list[subprocess.Popen[str]]
) -> None:
    with ServerProcess(tmp_path / "server") as server:
        stub = server.stub()
        join(stub, ODD_ID, make_spec([(4,)], env_id=ODD_ENV), session=ODD_SESSION)
        trainers.extend(start_trainer(server.address, pid, tmp_path) for pid in TRAINERS)

        # The page lists both trainers and draws a version, then a newer one
        # arrives while the same document stays loaded.
        browser.get(server.dashboard_url)
        browser.execute_script("window.sameDocument = true;")
        eventually(
            lambda: {r[0] for r in page_participants(browser, "default") or []} == set(TRAINERS),
            "both participants on the page",
        )
        first = eventually(lambda: newest_version_shown(browser), "a version on the page")
        newer = eventually(
            lambda: (v := newest_version_shown(browser)) is not None and v > first and v,
            "a newer version on the page without reloading",
        )
        eventually(lambda: page_curve(browser, "default", "eval"), "an evaluation on the curve")
        still_same_document = browser.execute_script("return window.sameDocument === true;")

        # Once training ends nothing changes: the page must then agree with Status.
        for trainer in trainers:
            trainer.terminate()
        for trainer, pid in zip(trainers, TRAINERS, strict=True):
            assert trainer.wait(WAIT_S) == 0, (tmp_path / f"{pid}.log").read_text()
        reply = stub.Status(pb.StatusRequest(session="default", max_versions=1000))
        state = reply.sessions[0]
        shown = eventually(
            lambda: (
                (rows := page_participants(browser, "default")) == rpc_participants(state) and rows
            ),
            "the participant table to match the Status RPC",
            timeout=30,
        )
        eval_points = page_curve(browser, "default", "eval")
        mean_points = page_curve(browser, "default", "mean")
        odd_id, odd_env = browser.execute_script(_HEADER, ODD_SESSION)
        pwned = browser.execute_script("return window.pwned === undefined ? null : window.pwned;")
        injected = browser.find_elements(By.CSS_SELECTOR, "main img, main script")
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        screenshot = tmp_path / "dashboard.png"
        browser.save_screenshot(str(screenshot))

    assert newer > first and still_same_document
    assert [row[0] for row in shown] == [p.participant_id for p in state.participants]
    assert eval_points == rpc_curve(state, "eval_return") and eval_points
    assert mean_points == rpc_curve(state, "mean_return")
    assert (odd_id, odd_env) == (ODD_ID, ODD_ENV)
    assert pwned is None and injected == []
    assert errors == []
    assert screenshot.stat().st_size > 10_000
