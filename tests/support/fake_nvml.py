"""A stand-in for NVIDIA's NVML binding (`pynvml`): the calls GpuMonitor makes, for n GPUs.

No GPU is lent to the tests; this answers with pynvml's names and its error
class, so the monitor's readings and refusals can be checked anyway.
"""

from __future__ import annotations

import types
from dataclasses import dataclass


class NVMLError(Exception):
    pass


@dataclass
class Memory:
    used: int
    total: int


@dataclass
class Utilization:
    gpu: int


def fake_nvml(*, gpus: int, init_fails: bool = False) -> types.ModuleType:
    """A module that answers the calls GpuMonitor makes, for `gpus` GPUs."""
    calls = {"util": 0}

    def init() -> None:
        if init_fails:
            raise NVMLError("Driver Not Loaded")

    def utilization(handle: int) -> Utilization:
        calls["util"] += 1
        return Utilization(gpu=80 + handle)

    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    module.calls = calls  # type: ignore[attr-defined]
    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: gpus  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda index: index  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda handle: b"NVIDIA H100"  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda handle: Memory(  # type: ignore[attr-defined]
        used=(3 + handle) * 2**30, total=80 * 2**30
    )
    module.nvmlDeviceGetUtilizationRates = utilization  # type: ignore[attr-defined]
    module.nvmlDeviceGetTemperature = lambda handle, sensor: 60 + handle  # type: ignore[attr-defined]
    return module
