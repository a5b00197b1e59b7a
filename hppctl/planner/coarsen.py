"""Merge consecutive layers into super-layers: a cheap first pass whose plans are also fine plans.

A cut between super-layers is a cut between layers, and Algorithm 1 on a super-layer range
sees the same per-device times (sums of the same layers), so a plan found on the coarse
profile lies inside the fine DP's search space. Its fine latency is therefore a valid bound
for pruning the fine DP (`strategies/asteroid.py`).
"""

from __future__ import annotations

from hppctl.models.profile import DeviceProfile, LayerCost, Profile
from hppctl.planner.cost import CostModel, StageChoice


def coarsen(profile: Profile, size: int) -> tuple[Profile, list[int]]:
    """Groups of `size` consecutive layers; returns the coarse profile and the fine start of each group."""
    L = len(profile.layers)
    starts = list(range(0, L, size))
    bounds = starts + [L]
    layers = []
    for a, b in zip(bounds, bounds[1:]):
        chunk = profile.layers[a:b]
        layers.append(LayerCost(
            name=f"{chunk[0].name}..{chunk[-1].name}", kind="group",
            boundary_bytes_per_sample=chunk[-1].boundary_bytes_per_sample,
            activation_bytes_per_sample=sum(l.activation_bytes_per_sample for l in chunk),
            param_bytes=sum(l.param_bytes for l in chunk),
            forward_flops_per_sample=sum(l.forward_flops_per_sample for l in chunk),
        ))
    devices = [
        DeviceProfile(name=d.name, kind=d.kind, memory_bytes=d.memory_bytes, batch_sizes=d.batch_sizes,
                      forward_s=_sum_rows(d.forward_s, bounds), backward_s=_sum_rows(d.backward_s, bounds),
                      peak_flops=d.peak_flops)
        for d in profile.devices
    ]
    coarse = profile.model_copy(update={"layers": layers, "devices": devices})
    return coarse, starts


def _sum_rows(rows: list[list[float]], bounds: list[int]) -> list[list[float]]:
    return [[sum(col) for col in zip(*rows[a:b])] for a, b in zip(bounds, bounds[1:])]


def refine_stages(fine: CostModel, coarse_stages: list[StageChoice], starts: list[int]) -> list[StageChoice] | None:
    """Map a coarse plan to fine layer indices and re-run Algorithm 1 there (None if it no longer fits)."""
    from hppctl.planner.allocation import allocate
    from hppctl.planner.cost import asteroid_warmup

    ends = starts[1:] + [fine.num_layers]
    P, out = len(coarse_stages), []
    for p, s in enumerate(coarse_stages):
        start, end = starts[s.start], ends[s.end - 1]
        samples = allocate(fine, list(s.devices), start, end, asteroid_warmup(P, p, fine.M))
        if samples is None:
            return None
        out.append(StageChoice(start, end, s.devices, tuple(samples)))
    return out
