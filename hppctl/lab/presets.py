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
from dataclasses import dataclass

from hppctl.errors import BadInput

CFS_PERIOD_US = 100_000
"""100 ms, the kernel's and docker's default. A throttled host resumes every period with caches
that its neighbours' work has evicted, and pays for that in CPU time once per period: measured
here, a 0.25-core host spent 12-17% more CPU per training step than a 1-core one at 20 ms periods
and 4-7% at 100 ms (0.5 core: 9-12% and 4-6%), so at 20 ms a host was that much slower than its
quota says. The price: a throttled host runs in bursts (a 0.25-core host 25 ms, then a 75 ms
stall) rather than evenly; `cpu_period: 20ms` in a lab spec chooses evenness (docs/lab.md)."""
CFS_MIN_QUOTA_US = 1_000
"""The kernel refuses quotas below 1 ms; the period grows for hosts slower than 1 ms per period
(0.01 core at 100 ms)."""


@dataclass(frozen=True)
class DevicePreset:
    name: str
    peak_gflops_fp32: float
    memory_bytes: int
    derivation: str


PRESETS: dict[str, DevicePreset] = {p.name: p for p in (
    DevicePreset("jetson-nano", 235.8, 4 * 2**30, "128 Maxwell CUDA cores x 921.6 MHz x 2 (FMA); 4 GB LPDDR4"),
    DevicePreset("jetson-tx2", 665.6, 8 * 2**30, "256 Pascal CUDA cores x 1.30 GHz x 2 (FMA); 8 GB LPDDR4"),
    DevicePreset("jetson-nx", 844.8, 8 * 2**30, "Xavier NX: 384 Volta CUDA cores x 1.10 GHz x 2 (FMA); 8 GB LPDDR4x"),
    DevicePreset("rpi4", 48.0, 4 * 2**30, "Raspberry Pi 4B: 4 Cortex-A72 x 1.5 GHz x 8 (128-bit NEON FMA); 4 GB model"),
    DevicePreset("laptop-cpu", 320.0, 16 * 2**30, "4-core x86 laptop, 2.5 GHz sustained x 32 (2 AVX2 FMA units); 16 GB"),
)}


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
