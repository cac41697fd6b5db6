"""The check's report: everything it found and measured, and how it is printed."""

from __future__ import annotations

from dataclasses import dataclass

from fedrl.client.commands.check.env_probes import WidthProbe
from fedrl.client.commands.check.facts import Machine
from fedrl.client.commands.check.learner_probes import UpdateProbe
from fedrl.client.commands.check.recommendation import Recommendation
from fedrl.client.commands.check.server_probe import ServerCheck


@dataclass(frozen=True)
class Report:
    machine: Machine
    server: ServerCheck | None
    widths: tuple[WidthProbe, ...]
    workers: dict[int, float]
    """Aggregate actor env steps/s by number of parallel actor processes."""
    updates: tuple[UpdateProbe, ...]
    recommendation: Recommendation
    probe_seconds: float
    problems: tuple[str, ...]
    """Parts of the probe that failed; the recommendation was made without them."""


def render(report: Report) -> str:
    m = report.machine
    lines = ["Machine"]
    physical = f", {m.cores_physical} physical" if m.cores_physical else ""
    lines += [
        f"  cpu        {m.cpu}",
        f"  cores      {m.cores_usable} usable of {m.cores_logical} logical{physical}",
        f"  memory     {m.memory_gib:.1f} GiB, {m.memory_available_gib:.1f} GiB available",
    ]
    if m.gpus:
        lines.append(f"  cuda       {m.cuda}")
        for index, gpu in enumerate(m.gpus):
            lines.append(
                f"  gpu {index}      {gpu.name}, {gpu.memory_gib:.1f} GiB, compute "
                f"{gpu.capability}, bf16 {'yes' if gpu.bf16 else 'no'}"
            )
    else:
        lines.append("  gpu        none (CUDA not available to torch)")
    if m.gpu_readings:
        lines += [f"  nvml       {reading.line()}" for reading in m.gpu_readings]
    else:
        lines.append(f"  nvml       no GPU readings: {m.gpu_readings_missing}")
    lines.append("  versions   " + ", ".join(f"{k} {v}" for k, v in m.versions.items()))
    if report.server is not None:
        s = report.server
        lines += ["", f"Server {s.target}"]
        lines.append(f"  reachable  {'yes' if s.reachable else 'no'}")
        lines.append(f"  tls        {s.tls}")
        lines.append(f"  health     {s.service}")
        lines += [f"  PROBLEM    {p}" for p in s.problems]
    lines += ["", "Probe (measured here, one thread each)"]
    for p in report.widths:
        lines.append(
            f"  {p.envs:>3} envs   env {p.env_steps_per_s:>11,.0f} steps/s   inference "
            f"{p.inference_us:>7.0f} µs   actor {p.actor_steps_per_s:>11,.0f} steps/s"
        )
    for count, rate in sorted(report.workers.items()):
        lines.append(f"  {count:>3} actors {rate:>11,.0f} env steps/s together")
    for u in report.updates:
        lines.append(
            f"  {u.device:<4} batch {u.batch_size:>4}   {u.updates_per_s:>9,.0f} updates/s   "
            f"{u.updates_per_s * u.batch_size:>11,.0f} samples/s"
        )
    rec = report.recommendation
    lines += ["", "Recommendation", f"  {rec.command()}"]
    lines += [f"  - {reason}" for reason in rec.reasons]
    lines += [f"  PROBLEM {problem}" for problem in report.problems]
    lines.append(f"  (probe took {report.probe_seconds:.1f} s; nothing was changed)")
    return "\n".join(lines)
