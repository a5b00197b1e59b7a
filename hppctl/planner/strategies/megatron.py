"""`megatron`: Megatron-LM tensor parallelism, the paper's M-LM baseline.

Equal heads and MLP columns on every device (it assumes identical accelerators), an AllReduce after
the attention and after the MLP block, and the connective blocks replicated on the whole sequence.
It ignores memory budgets: a device over its budget is reported (OOM), not avoided.
"""

from __future__ import annotations

from hppctl.planner.inference_costs import InferenceCosts, Layout, inference_strategy, largest_remainder


@inference_strategy("megatron", "equal tensor parallel split, AllReduce after attention and MLP, replicated connective")
def plan_megatron(costs: InferenceCosts) -> Layout:
    D, p = costs.D, costs.profile
    equal = [1.0] * D
    return Layout(tuple(range(D)), tuple(largest_remainder(p.heads, equal)),
                  tuple(largest_remainder(p.intermediate, equal)), (costs.seq_len,) * D, memory_aware=False)
