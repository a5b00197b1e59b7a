"""`local`: the whole model on one device, the paper's Local baseline.

The fastest device (highest V_d) whose budget holds the model; if none does, the fastest one,
reported as OOM.
"""

from __future__ import annotations

from hppctl.planner.inference_costs import InferenceCosts, Layout, inference_strategy


@inference_strategy("local", "one device runs the whole model (the fastest that fits)")
def plan_local(costs: InferenceCosts) -> Layout:
    p = costs.profile
    by_speed = sorted(range(costs.D), key=lambda d: (-costs.capacity(d), costs.names[d]))
    fitting = [d for d in by_speed if costs.fits(d, p.heads, p.intermediate)]
    d = (fitting or by_speed)[0]
    return Layout((d,), (p.heads,), (p.intermediate,), (costs.seq_len,), memory_aware=bool(fitting))
