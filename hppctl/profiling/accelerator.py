"""What a device computes on: the cluster file's `accelerator:` resolved where the code runs.

Used on the device by the training and inference workers (through runtime/accelerator.py, which
re-exports it) and by the profiling probe, so a profile and a run resolve `auto` the same way.
Everything that differs between CUDA and the CPU is here and takes the `torch.device`: the
accelerator's name and memory, waiting for queued work before reading a clock, the allocator's peak.
"""

from __future__ import annotations

from typing import Callable

import torch

from hppctl.errors import BadInput

ACCELERATORS = ("cpu", "cuda", "auto")


class AcceleratorUnavailable(BadInput):
    """The cluster file asks for an accelerator this device does not have."""


def resolve(accelerator: str, *, device_name: str = "this device",
            cuda_available: Callable[[], bool] | None = None) -> torch.device:
    """The `torch.device` a worker computes on for the cluster file's `accelerator:` value.

    `cuda_available` defaults to `torch.cuda.is_available` (a parameter so that `auto` can be
    exercised on a machine without CUDA)."""
    available = (cuda_available or torch.cuda.is_available)
    if accelerator == "cpu":
        return torch.device("cpu")
    if accelerator == "auto":
        return torch.device("cuda", 0) if available() else torch.device("cpu")
    if accelerator == "cuda":
        if not available():
            raise AcceleratorUnavailable(
                f"device {device_name}: accelerator: cuda, but torch {torch.__version__} sees no CUDA device there "
                f"(torch.cuda.is_available() is False); use accelerator: auto or cpu")
        return torch.device("cuda", 0)
    raise BadInput(f"device {device_name}: accelerator: {accelerator!r} is not one of {', '.join(ACCELERATORS)}")


# --- what a device has ----------------------------------------------------------------------------

def describe(device: torch.device) -> dict:
    """The accelerator of a resolved device: `{"type", "name", "memory_bytes"}` (memory: the GPU's
    total as CUDA reports it; None on CPU, whose memory the profile's host figures give)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "memory_bytes": int(props.total_memory)}
    return {"type": device.type, "name": None, "memory_bytes": None}


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (before reading a host clock around it); nothing on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """The allocator's peak since the last reset (CUDA); None where the process's RSS is the measure."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None
