"""`sp`: sequence parallelism (Li et al.), the paper's SP baseline.

Every device holds the whole model and an equal share of the sequence; the attention blocks
AllGather K and V. It ignores memory budgets: a device over its budget is reported (OOM).
"""

from __future__ import annotations

from hppctl.planner.inference_costs import InferenceCosts, Layout, inference_strategy, split_rows


@inference_strategy("sp", "sequence parallel: full weights everywhere, equal sequence split, AllGather of K and V")
def plan_sp(costs: InferenceCosts) -> Layout:
    D, p = costs.D, costs.profile
    return Layout(tuple(range(D)), (p.heads,) * D, (p.intermediate,) * D, tuple(split_rows(costs.seq_len, D)),
                  memory_aware=False)
