"""The check's progress: what it measures now, how far it is, and how long it has run.

The same reporter as training's (fedrl.client.commands.progress): a tqdm bar
over the check's measurements on a terminal, with the probe, the setting,
how far the measurement is and what it gave; where
stderr is not a terminal, one plain `check key=value ...` line as each
measurement ends, with its figure, and one every few seconds within a long
one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from fedrl.client.commands.progress import ProgressField, ProgressReporter

CHECK_FIELDS: tuple[ProgressField, ...] = (
    ProgressField("done", "", "Measurements finished.", 0),
    ProgressField("of", "of", "Measurements the check makes.", 0),
    ProgressField(
        "probe",
        "",
        "What is measured: machine, server, env stepping, inference, learner update, PPO "
        "update, actor processes.",
        0,
    ),
    ProgressField("setting", "at", "The setting measured: 16 envs, batch 64 on cpu, 7 at once.", 0),
    ProgressField(
        "status",
        "",
        "How far the measurement is: warming up, seconds measured of those it takes, actor "
        "processes started.",
        0,
    ),
    ProgressField("result", "gave", "What the measurement gave, once it is done.", 0),
    ProgressField("elapsed_s", "", "Seconds since the check began.", 1, on_bar=False),
)
STATUS_EVERY_S = 0.2
"""Within a measurement, how often its status is handed to the reporter (which throttles again)."""


class CheckProgress:
    """Tells a reporter where the check stands; says nothing without one (tests, library use).

    `begin` names a measurement, `status` says how far it is, `end` counts it
    done with the figure it gave, and shows it at once: a plain log gets one
    line per measurement, and one every few seconds within a long one.
    """

    def __init__(
        self,
        reporter: ProgressReporter | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reporter = reporter
        self._clock = clock
        self._start = clock()
        self._done = 0
        self._steps: int | None = None

    def plan(self, steps: int) -> None:
        """The check makes `steps` measurements in all (known once the machine's facts are)."""
        self._steps = steps

    def begin(self, probe: str, setting: str | None = None) -> None:
        """A measurement starts."""
        self._show(probe=probe, setting=setting, status="starting", result=None)

    def status(self, text: str) -> None:
        """How far the measurement is."""
        self._show(status=text)

    def end(self, figure: str | None = None) -> None:
        """The measurement is done; `figure` is what it measured."""
        self._done += 1
        self._show(force=True, status="done", result=figure)

    def _show(self, *, force: bool = False, **fields: str | None) -> None:
        if self._reporter is None:
            return
        self._reporter.update(
            force=force,
            done=self._done,
            of=self._steps,
            elapsed_s=self._clock() - self._start,
            **fields,
        )


def check_reporter(
    *,
    stream: TextIO | None = None,
    tty: bool | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ProgressReporter:
    """The reporter the check shows its progress with: on stderr unless `stream` is given, a
    bar where that is a terminal (or `tty` says so)."""
    return ProgressReporter(
        description="check",
        fields=CHECK_FIELDS,
        count="done",
        total="of",
        unit="step",
        stream=stream,
        tty=tty,
        interval_s=5.0,
        clock=clock,
    )


def timed(call: Callable[[], int], seconds: float, progress: CheckProgress) -> float:
    """Units per second of `call` (which returns units done) over about `seconds`."""
    progress.status("warming up")
    call()  # warm-up: first calls pay allocation and lazy initialisation
    done, start, shown = 0, time.perf_counter(), 0.0
    while (elapsed := time.perf_counter() - start) < seconds:
        done += call()
        if elapsed - shown >= STATUS_EVERY_S:
            shown = elapsed
            progress.status(f"{elapsed:.1f} of {seconds:.1f} s")
    return done / elapsed
