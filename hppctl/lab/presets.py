"""Device presets of the edge lab: each device's CPU quota and memory limit, by documented ratios.

Self-contained on purpose (the planner's device models live in hppctl/profiling/presets.py and
may change independently). The numbers and their sources are in docs/lab.md, "Presets".

CPU: a device's quota is its peak FP32 FLOP/s relative to the fastest device in the table, times
the cores given to the fastest one (`fastest_cpu`, default 1 core, never more than this machine
has). The Jetsons train on their GPU, so their GPU peak counts; the Raspberry Pi and the laptop
have no usable GPU, so their CPU peak counts.

Memory: each device's RAM (unified CPU/GPU memory on Jetsons) times `memory_scale` (default
1/4), so that a five-device lab needs a few GB of this machine's RAM, not 30.
"""

from __future__ import annotations

import math
import os

from hppctl.errors import BadInput
# The data (constants, the preset table) lives in the models layer, below the lab spec that validates
# preset names (hppctl/models/lab_presets.py); the lab imports it from there.
from hppctl.models.lab_presets import CFS_MIN_QUOTA_US, CFS_PERIOD_US, PRESETS, DevicePreset


def fastest_preset() -> DevicePreset:
    return max(PRESETS.values(), key=lambda p: p.peak_gflops_fp32)


def preset_cpu(name: str, fastest_cpu: float = 1.0, cores: int | None = None) -> float:
    """Cores of CPU quota for a preset: its FLOP/s share of the fastest preset's, times `fastest_cpu`."""
    preset = _get(name)
    top = min(fastest_cpu, cores or os.cpu_count() or 1)
    return round(top * preset.peak_gflops_fp32 / fastest_preset().peak_gflops_fp32, 4)


def preset_memory(name: str, memory_scale: float = 0.25) -> int:
    """Memory limit in bytes for a preset: its RAM times `memory_scale`, rounded to whole MiB."""
    return int(_get(name).memory_bytes * memory_scale) // 2**20 * 2**20


def cfs_quota(cpu: float, period_us: int = CFS_PERIOD_US) -> tuple[int, int]:
    """(quota_us, period_us) for `cpu` cores, honouring the kernel's 1 ms minimum quota."""
    period = period_us
    if cpu * period < CFS_MIN_QUOTA_US:
        period = min(1_000_000, math.ceil(CFS_MIN_QUOTA_US / cpu))
    return max(CFS_MIN_QUOTA_US, round(cpu * period)), period


def _get(name: str) -> DevicePreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise BadInput(f"unknown lab preset {name!r} (known: {', '.join(sorted(PRESETS))})") from None
