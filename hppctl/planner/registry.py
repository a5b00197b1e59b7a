"""Strategies by name. A strategy maps (cost model, request) to stage choices; adding one is adding a module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from hppctl.planner.cost import CostModel, StageChoice

if TYPE_CHECKING:
    from hppctl.models.plan import HppPlan, PlanRequest


@dataclass(frozen=True)
class Candidate:
    """A strategy's answer: stages, the schedule it runs with, and whether it respects memory budgets."""

    stages: list[StageChoice]
    schedule: str = "1f1b-asteroid"
    memory_aware: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)
    build_plan: "Callable[[PlanRequest, str, float], HppPlan] | None" = None
    """For plans Asteroid's evaluation cannot describe (Bi-Partition's separate backward ranges):
    the strategy builds the plan itself from (request, strategy name, planning seconds)."""


StrategyFn = Callable[[CostModel], "Candidate | None"]
STRATEGIES: dict[str, StrategyFn] = {}
DESCRIPTIONS: dict[str, str] = {}


def strategy(name: str, description: str):
    def register(fn: StrategyFn) -> StrategyFn:
        STRATEGIES[name] = fn
        DESCRIPTIONS[name] = description
        return fn
    return register
