"""Per-GPU utilisation, memory and temperature, as NVIDIA's management library (NVML) reports them.

NVML is what `nvidia-smi` reads; nvidia-ml-py is NVIDIA's own binding of it
(imported as `pynvml`). It sees every GPU of the machine, whichever process
uses it, so rank 0's progress line shows the GPUs of all learner ranks on
its machine. Where there is no NVIDIA driver, no GPU or no binding, the
monitor says which, in words, instead of reading anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

READ_EVERY_S = 2.0
"""Fresh readings at most this often: a progress line comes every few seconds, and NVML
takes a few milliseconds per GPU to answer."""


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment."""

    index: int
    name: str
    utilization_pct: float
    """Share of the last sample period in which a kernel ran (NVML's GPU utilisation)."""
    memory_used_gib: float
    memory_total_gib: float
    temperature_c: float

    def brief(self) -> str:
        """`0:87%/3.1of80GiB/61C`: one GPU in a progress line."""
        return (
            f"{self.index}:{self.utilization_pct:.0f}%/{self.memory_used_gib:.1f}of"
            f"{self.memory_total_gib:.0f}GiB/{self.temperature_c:.0f}C"
        )

    def line(self) -> str:
        """One GPU in `fedrl-client check`."""
        return (
            f"gpu {self.index} {self.name}: utilisation {self.utilization_pct:.0f} %, memory "
            f"{self.memory_used_gib:.1f} of {self.memory_total_gib:.1f} GiB, "
            f"{self.temperature_c:.0f} °C"
        )


def _import_nvml() -> ModuleType:
    import pynvml  # noqa: PLC0415  (only where GPUs are asked about)

    module: ModuleType = pynvml
    return module


class GpuMonitor:
    """Readings of every GPU NVML finds, or why there are none (`none_reason`)."""

    def __init__(
        self,
        *,
        nvml: Callable[[], ModuleType] = _import_nvml,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`nvml` imports the binding (tests pass a stand-in)."""
        self._clock = clock
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._last: tuple[float, tuple[GpuReading, ...]] | None = None
        self.none_reason: str | None = None
        """Why no GPU is read, in words; None when at least one is."""
        try:
            module = nvml()
        except ImportError:
            self.none_reason = "NVIDIA's management library binding (nvidia-ml-py) is missing"
            return
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            self.none_reason = f"NVIDIA's management library is not available here ({exc})"
            return
        self._nvml = module
        try:
            count = module.nvmlDeviceGetCount()
            self._handles = [module.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except module.NVMLError as exc:
            self.none_reason = f"NVIDIA's management library could not list GPUs ({exc})"
        if not self._handles and self.none_reason is None:
            self.none_reason = "NVIDIA's management library found no GPU"

    @property
    def found(self) -> bool:
        return bool(self._handles)

    def read(self) -> tuple[GpuReading, ...]:
        """Every GPU now, or as of at most READ_EVERY_S ago; empty when there are none."""
        if not self._handles:
            return ()
        now = self._clock()
        if self._last is not None and now - self._last[0] < READ_EVERY_S:
            return self._last[1]
        nvml = self._nvml
        readings = []
        try:
            for index, handle in enumerate(self._handles):
                name = nvml.nvmlDeviceGetName(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                readings.append(
                    GpuReading(
                        index=index,
                        name=name.decode() if isinstance(name, bytes) else str(name),
                        utilization_pct=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                        memory_used_gib=memory.used / 2**30,
                        memory_total_gib=memory.total / 2**30,
                        temperature_c=float(
                            nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                        ),
                    )
                )
        except nvml.NVMLError:
            # A reading is for people to look at; training never stops for one.
            return self._last[1] if self._last is not None else ()
        self._last = (now, tuple(readings))
        return self._last[1]

    def brief(self) -> str | None:
        """Every GPU for a progress line (`0:87%/3.1of80GiB/61C,1:...`); None without GPUs."""
        readings = self.read()
        return ",".join(r.brief() for r in readings) if readings else None

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None
            self._handles = []
