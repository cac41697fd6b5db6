"""Facts about this machine and its software: CPU, cores, memory, GPUs and versions."""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import psutil
import torch

from fedrl.client.commands.gpu_stats import GpuMonitor, GpuReading
from fedrl.client.training.engine_config import available_cores


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    capability: str
    bf16: bool


@dataclass(frozen=True)
class Machine:
    """Facts about this machine and its software."""

    cpu: str
    cores_usable: int
    cores_logical: int
    cores_physical: int | None
    memory_gib: float
    memory_available_gib: float
    cuda: str | None
    gpus: tuple[Gpu, ...]
    versions: dict[str, str]
    gpu_readings: tuple[GpuReading, ...] = ()
    """Every GPU as NVIDIA's management library sees it now: utilisation, memory, temperature."""
    gpu_readings_missing: str | None = None
    """Why there are no readings, in words; None when there are."""


def machine_facts() -> Machine:
    memory = psutil.virtual_memory()
    gpus: list[Gpu] = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            with torch.cuda.device(index):
                bf16 = torch.cuda.is_bf16_supported()
            gpus.append(
                Gpu(
                    name=props.name,
                    memory_gib=props.total_memory / 2**30,
                    capability=f"{props.major}.{props.minor}",
                    bf16=bf16,
                )
            )
    monitor = GpuMonitor()
    try:
        readings = monitor.read()
    finally:
        monitor.close()
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for package in ("grpcio", "protobuf", "numpy", "gymnasium", "fedrl"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    return Machine(
        cpu=_cpu_name(),
        cores_usable=available_cores(),
        cores_logical=os.cpu_count() or 1,
        cores_physical=psutil.cpu_count(logical=False),
        memory_gib=memory.total / 2**30,
        memory_available_gib=memory.available / 2**30,
        cuda=torch.version.cuda if torch.cuda.is_available() else None,
        gpus=tuple(gpus),
        versions=versions,
        gpu_readings=readings,
        gpu_readings_missing=monitor.none_reason,
    )


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
