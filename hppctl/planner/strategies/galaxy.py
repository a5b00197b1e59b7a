"""`galaxy`: heterogeneity- and memory-aware hybrid tensor + sequence parallelism (Galaxy, Algorithm 1)."""

from __future__ import annotations

from hppctl.planner.inference_costs import InferenceCosts, Layout, galaxy_layout, inference_strategy


@inference_strategy("galaxy", "heads and MLP columns by capacity, memory-aware shifting, equal sequence split")
def plan_galaxy(costs: InferenceCosts) -> Layout | None:
    return galaxy_layout(costs)
