"""Re-scoring a plan file (`hppctl plan --plan FILE`): every number recomputed from the profile. Pure.

A plan file's figures (prediction, stage and transfer times, memory per device, warm-up depths) are
claims: anyone can edit them. Re-scoring keeps only what the plan *decides* — layer ranges (forward
and backward), devices, samples per device, batch sizes, schedule — and recomputes the rest with the
model its strategy family is scored by: Asteroid's evaluation (planner/cost.py) for plans of one
layer range per stage, Bi-Partition's (planner/bipartition.py, the same model the planner ranks and
builds its plans with) for plans with separate backward ranges. Where a stored number differs from
the recomputed one (relative tolerance `REL_TOL`), both are reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hppctl.errors import BadInput
from hppctl.models.plan import HppPlan, MemoryViolation, PlanRequest
from hppctl.models.profile import Profile
from hppctl.planner import cost_model, to_plan
from hppctl.planner.registry import Candidate

REL_TOL = 1e-6
"""Stored and recomputed agree within this relative tolerance (a YAML round trip keeps ~15 digits)."""

NOT_RECOMPUTED = ("strategy", "planning_time_s", "micro_batch_choice")
"""Facts about how the plan was made, not predictions: kept from the file, never compared (the
alternatives `--micro-batch auto` weighed are other plans, which re-scoring this one cannot redo)."""


@dataclass(frozen=True)
class Difference:
    field: str
    """Dotted path in the plan document, e.g. `prediction.round_latency_s`, `stages.0.memory_bytes.1`."""
    stored: object
    recomputed: object

    def as_json(self) -> dict:
        return {"field": self.field, "stored": self.stored, "recomputed": self.recomputed}


@dataclass(frozen=True)
class Rescored:
    plan: HppPlan
    """The plan with every number recomputed from the profile (its decisions unchanged)."""
    differences: list[Difference]
    """Every stored number that disagrees with its recomputed value."""

    @property
    def worst_violation(self) -> MemoryViolation | None:
        """The device furthest over its budget, if any."""
        return max(self.plan.memory_violations, key=lambda v: v.needed_bytes - v.budget_bytes, default=None)


def rescore(plan: HppPlan, profile: Profile) -> Rescored:
    """`plan` re-scored on `profile` (which `check_plan_matches` has accepted for it)."""
    recomputed = recompute(plan, profile)
    return Rescored(recomputed, differences(plan, recomputed))


def recompute(plan: HppPlan, profile: Profile) -> HppPlan:
    request = PlanRequest(global_batch=plan.global_batch, micro_batch=plan.micro_batch)
    cm = cost_model(profile, request)
    if any(s.backward_layers is not None for s in plan.stages):
        _require_one_device_per_stage(plan)
        workers = [cm.names.index(s.devices[0]) for s in plan.stages]
        forward = [0] + [s.end for s in plan.stages]
        backward = [0] + [s.backward[1] for s in plan.stages]
        scored = build_bipartition_plan(cm, workers, forward, backward, request, plan.strategy, plan.planning_time_s)
    else:
        from hppctl.planner.explain import stage_choices

        candidate = Candidate(stage_choices(plan, profile), schedule=plan.schedule)
        scored = to_plan(cm, profile, request, plan.strategy, candidate, plan.planning_time_s)
    # Bi-Partition's builder leaves violations to its planner (which only returns plans that fit):
    # a foreign plan gets them from its recomputed memory, alike for both kinds.
    return scored.model_copy(update={"memory_violations": memory_violations(scored),
                                     "micro_batch_choice": plan.micro_batch_choice})


def build_bipartition_plan(cm, workers: list[int], forward: list[int], backward: list[int], request: PlanRequest,
                           strategy: str, planning_time_s: float) -> HppPlan:
    """The plan of Bi-Partition cuts on `workers` (device indices, head first), scored exactly as the
    Bi-Partition strategies score what they plan: the runtime's model (`BiOptions()`), built by their
    own `build_plan`."""
    from hppctl.planner.bipartition import BiOptions, costs_from_model, evaluate
    from hppctl.planner.strategies.bipartition import SCHEDULE, build_plan

    try:
        result = evaluate(costs_from_model(cm, workers, BiOptions(), SCHEDULE), forward, backward)
    except ValueError as e:  # cuts the plan model accepts but Bi-Partition's does not
        raise BadInput(f"stages: {e}") from None
    return build_plan(cm, workers, result, request, strategy, planning_time_s)


def memory_violations(plan: HppPlan) -> list[MemoryViolation]:
    return [MemoryViolation(device=d, stage=p, needed_bytes=need, budget_bytes=budget)
            for p, s in enumerate(plan.stages)
            for d, need, budget in zip(s.devices, s.memory_bytes, s.memory_budget_bytes) if need > budget]


def _require_one_device_per_stage(plan: HppPlan) -> None:
    for p, stage in enumerate(plan.stages):
        if len(stage.devices) != 1:
            raise BadInput(f"stages.{p}.devices: a Bi-Partition stage (one with backward_layers in the plan) runs "
                           f"on one device, this one lists {len(stage.devices)}")


def differences(stored: HppPlan, recomputed: HppPlan) -> list[Difference]:
    a, b = stored.model_dump(mode="json"), recomputed.model_dump(mode="json")
    for key in NOT_RECOMPUTED:
        a.pop(key, None)
        b.pop(key, None)
    out: list[Difference] = []
    _compare(a, b, "", out)
    return out


def _compare(stored, recomputed, path: str, out: list[Difference]) -> None:
    if isinstance(stored, dict) and isinstance(recomputed, dict):
        for key in list(stored) + [k for k in recomputed if k not in stored]:
            _compare(stored.get(key), recomputed.get(key), f"{path}.{key}" if path else key, out)
    elif isinstance(stored, list) and isinstance(recomputed, list) and len(stored) == len(recomputed):
        for i, (x, y) in enumerate(zip(stored, recomputed)):
            _compare(x, y, f"{path}.{i}", out)
    elif not _same(stored, recomputed):
        out.append(Difference(path, stored, recomputed))


def _same(x, y) -> bool:
    numbers = (int, float)
    if isinstance(x, numbers) and isinstance(y, numbers) and not isinstance(x, bool) and not isinstance(y, bool):
        return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=1e-12)
    return x == y
