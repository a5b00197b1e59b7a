"""`dp`: data parallelism over a heterogeneity-balanced group (the paper's DP baseline, made fair).

One stage holds the whole model; each device gets a share of every micro-batch by
Algorithm 1 (capacity-proportional, memory-capped), gradients accumulate over the M
micro-batches and are AllReduced once per round. Its strongest honest form also tries
leaving the slowest devices out, since their share can cost more AllReduce than it saves.
"""

from __future__ import annotations

from hppctl.planner.allocation import allocate
from hppctl.planner.cost import CostModel, StageChoice
from hppctl.planner.registry import Candidate, strategy


def fastest_first(cm: CostModel) -> list[int]:
    speed = [cm.forward_time(d, 0, cm.num_layers, cm.B) + cm.backward_time(d, 0, cm.num_layers, cm.B)
             for d in range(len(cm.names))]
    return sorted(range(len(cm.names)), key=lambda d: (speed[d], cm.names[d]))


@strategy("dp", "data parallel: whole model on every device, heterogeneity-balanced split")
def plan_dp(cm: CostModel) -> Candidate | None:
    best, best_latency = None, float("inf")
    order = fastest_first(cm)
    for k in range(1, len(order) + 1):
        group = order[:k]
        samples = allocate(cm, group, 0, cm.num_layers, 1)
        if samples is None:
            continue
        stages = [StageChoice(0, cm.num_layers, tuple(group), tuple(samples))]
        latency = cm.evaluate(stages).round_latency_s
        if latency < best_latency:
            best, best_latency = stages, latency
    return Candidate(best) if best else None
