"""Per-GPU readings from NVML in progress lines and `check`, and plain words where there are none.

No GPU is lent to these tests: a stand-in for NVIDIA's binding answers as
`pynvml` does (its names and its error class), and the real binding on this
machine shows what a participant without a GPU sees.
"""

from __future__ import annotations

import io
import types

from fedrl.client.commands.check.facts import Machine, machine_facts
from fedrl.client.commands.check.recommendation import Recommendation
from fedrl.client.commands.check.report import Report, render
from fedrl.client.commands.gpu_stats import READ_EVERY_S, GpuMonitor
from fedrl.client.commands.progress import ProgressReporter, TrainingProgress
from fedrl.client.training.counters import Counters, PollResult
from tests.support.fake_nvml import fake_nvml


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_gpu_is_read_for_utilisation_memory_and_temperature_at_most_every_two_seconds() -> (
    None
):
    nvml, clock = fake_nvml(gpus=2), Clock()
    monitor = GpuMonitor(nvml=lambda: nvml, clock=clock)

    first = monitor.read()
    again = monitor.read()
    clock.now += READ_EVERY_S
    monitor.read()

    assert monitor.found and monitor.none_reason is None
    assert [(r.index, r.utilization_pct, r.temperature_c) for r in first] == [
        (0, 80, 60),
        (1, 81, 61),
    ]
    assert again is first
    assert nvml.calls["util"] == 4  # type: ignore[attr-defined]
    assert monitor.brief() == "0:80%/3.0of80GiB/60C,1:81%/4.0of80GiB/61C"
    assert first[1].line() == ("gpu 1 NVIDIA H100: utilisation 81 %, memory 4.0 of 80.0 GiB, 61 °C")


def test_the_progress_line_carries_every_gpu() -> None:
    stream = io.StringIO()
    reporter = ProgressReporter(stream=stream, tty=False)
    progress = TrainingProgress(
        reporter,
        target=10,
        epsilon=None,
        replay_size=lambda: None,
        gpus=GpuMonitor(nvml=lambda: fake_nvml(gpus=1)),
    )

    progress(Counters(), PollResult((), (), 0, 0, {}, None, False))

    assert "gpus=0:80%/3.0of80GiB/60C" in stream.getvalue()


def test_without_gpus_the_monitor_says_why_in_words() -> None:
    def missing() -> types.ModuleType:
        raise ImportError("No module named 'pynvml'")

    no_driver = GpuMonitor(nvml=lambda: fake_nvml(gpus=2, init_fails=True))
    no_binding = GpuMonitor(nvml=missing)
    no_gpu = GpuMonitor(nvml=lambda: fake_nvml(gpus=0))

    assert no_driver.read() == () and no_driver.brief() is None
    assert no_driver.none_reason == (
        "NVIDIA's management library is not available here (Driver Not Loaded)"
    )
    assert no_binding.none_reason is not None and "nvidia-ml-py" in no_binding.none_reason
    assert no_gpu.none_reason == "NVIDIA's management library found no GPU"


def test_check_on_a_machine_without_gpus_says_plainly_there_are_none() -> None:
    machine = machine_facts()

    nvml_lines = [line for line in render_machine(machine).splitlines() if "nvml" in line]

    # This machine has no NVIDIA driver; where one is lent, every GPU gets a line.
    if machine.gpu_readings:
        assert len(nvml_lines) == len(machine.gpu_readings)
    else:
        assert nvml_lines == [f"  nvml       no GPU readings: {machine.gpu_readings_missing}"]
        assert machine.gpu_readings_missing


def render_machine(machine: Machine) -> str:
    """render() needs a whole report; only its machine part is read here."""
    report = Report(
        machine=machine,
        server=None,
        widths=(),
        workers={},
        updates=(),
        recommendation=Recommendation(1, 1, 1, "cpu", ()),
        probe_seconds=0.0,
        problems=(),
    )
    return render(report)
