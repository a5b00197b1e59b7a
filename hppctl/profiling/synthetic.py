"""Synthetic profiles for tests and benchmarks (named as such: `source: synthetic`).

Pure Python and deterministic from a seed: layer costs drawn from plausible ranges, devices
given a speed factor and a saturating batch-efficiency curve so time is non-linear in batch size.
"""

from __future__ import annotations

import random

from hppctl.models.profile import DeviceProfile, LayerCost, LinkProfile, Profile

DEFAULT_GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def synthetic_profile(
    num_layers: int,
    speeds: list[float],
    *,
    memory_bytes: list[int] | None = None,
    seed: int = 0,
    bandwidth_bytes_per_s: float = 12.5e6,
    grid: list[int] | None = None,
    links: list[tuple[str, str, float]] = (),
    param_scale: float = 1.0,
    activation_scale: float = 1.0,
) -> Profile:
    """`speeds[d]` is device d's relative speed (1.0 ~ a Jetson Nano running a small CNN)."""
    rng = random.Random(seed)
    grid = grid or DEFAULT_GRID
    layers = []
    for i in range(num_layers):
        flops = rng.randint(1, 50) * 10**6
        layers.append(LayerCost(
            name=f"layer{i}", kind="Synthetic",
            boundary_bytes_per_sample=int(rng.randint(1, 64) * 1024 * activation_scale),
            activation_bytes_per_sample=int(rng.randint(1, 128) * 1024 * activation_scale),
            param_bytes=int(rng.randint(0, 256) * 1024 * param_scale),
            forward_flops_per_sample=flops,
        ))
    memory_bytes = memory_bytes or [4 * 10**9] * len(speeds)
    devices = []
    for d, speed in enumerate(speeds):
        forward, backward = [], []
        for layer in layers:
            base = layer.forward_flops_per_sample / (50e9 * speed)
            row = [base * b / _efficiency(b) + 20e-6 for b in grid]
            forward.append(row)
            backward.append([2.0 * t for t in row])
        devices.append(DeviceProfile(name=f"dev{d}", kind="synthetic", memory_bytes=memory_bytes[d],
                                     batch_sizes=list(grid), forward_s=forward, backward_s=backward))
    return Profile(
        source="synthetic", cluster="synthetic", model=f"synthetic-{num_layers}", granularity="fine",
        layers=layers, devices=devices, default_bytes_per_s=bandwidth_bytes_per_s,
        links=[LinkProfile(between=[a, b], bytes_per_s=bw) for a, b, bw in links],
    )


def _efficiency(batch: int) -> float:
    """Small batches under-use the device (Asteroid Fig. 6): 1/(1 + 8/b) of peak."""
    return 1.0 / (1.0 + 8.0 / batch)
