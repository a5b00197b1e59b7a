"""The edge lab's device presets and CFS constants, as data (no behaviour).

A leaf below both `hppctl.models.lab` (the lab spec validates preset names and defaults
`cpu_period` from it) and `hppctl.lab.presets` (which turns a preset into a CPU quota and a memory
limit), so the models layer never imports the lab package. The numbers and their sources are in
docs/lab.md, "Presets"; how they are used is in hppctl/lab/presets.py.
"""

from __future__ import annotations

from dataclasses import dataclass

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
