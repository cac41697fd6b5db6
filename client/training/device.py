"""Where a learner's tensors live: the device it trains on, and copies of its state for the CPU."""

from __future__ import annotations

from typing import Any

import torch


def resolve_device(name: str) -> torch.device:
    """Turn "auto"/"cpu"/"cuda"/"cuda:N" into a device that exists here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(
            f'unknown device {name!r}: use "auto", "cpu", "cuda" or "cuda:N"'
        ) from error
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f'unsupported device {name!r}: use "auto", "cpu", "cuda" or "cuda:N"')
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {name!r} requested but CUDA is not available "
            f'(torch {torch.__version__}); use --device cpu or "auto"'
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {name!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist"
        )
    return device


def to_cpu(value: Any) -> Any:
    """A copy of a nested state dict with every tensor moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_cpu(item) for item in value]
    return value
