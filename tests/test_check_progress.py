"""`fedrl-client check`'s progress: what it measures, how far it is, how long it has run."""

from __future__ import annotations

import io

from fedrl.client.commands.check.progress import CheckProgress, check_reporter, timed


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_progress_shows_each_measurement_with_its_result_and_the_time_taken() -> None:
    # prepare: no terminal, so plain lines; a clock the test moves
    clock, stream = Clock(), io.StringIO()
    reporter = check_reporter(stream=stream, tty=False, clock=clock)
    progress = CheckProgress(reporter, clock=clock)
    progress.plan(2)

    # act: two measurements, the second long enough for a line in between
    progress.begin("env stepping", "4 envs")
    clock.now = 1.0
    progress.end("1,000 steps/s")
    progress.begin("actor processes", "starting 15")
    clock.now = 7.0
    progress.status("9 of 15 ready")
    clock.now = 9.5
    progress.end("15 ready")
    reporter.close()

    # assert
    lines = stream.getvalue().splitlines()
    assert lines == [
        'check done=0/2 probe="env stepping" setting="4 envs" status=starting result=- '
        "elapsed_s=0.0",
        'check done=1/2 probe="env stepping" setting="4 envs" status=done '
        'result="1,000 steps/s" elapsed_s=1.0',
        'check done=1/2 probe="actor processes" setting="starting 15" status="9 of 15 ready" '
        "result=- elapsed_s=7.0",
        'check done=2/2 probe="actor processes" setting="starting 15" status=done '
        'result="15 ready" elapsed_s=9.5',
    ]


def test_a_timed_measurement_says_how_far_it_is() -> None:
    # prepare
    seen: list[str] = []

    class Recording(CheckProgress):
        def status(self, text: str) -> None:
            seen.append(text)

    # act
    rate = timed(lambda: 1, 0.5, Recording())

    # assert
    assert rate > 0
    assert seen[0] == "warming up"
    assert len(seen) > 1 and all(text.endswith("of 0.5 s") for text in seen[1:])
