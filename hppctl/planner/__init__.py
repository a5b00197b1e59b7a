"""PURE planning: profile + request -> plan. Imports neither torch nor fabric (a test checks).

`make_plan(profile, request, strategy)` is the one entry point; `compare` scores every
registered strategy on the same profile and request.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Callable

from hppctl.errors import BadInput, Infeasible
from hppctl.models.plan import HppPlan, MemoryViolation, PlanRequest, Prediction, StagePlan, TransferPlan
from hppctl.models.profile import Profile
from hppctl.models.units import format_bytes
from hppctl.planner import forked, progress
from hppctl.planner.cost import WARMUP_POLICIES, CostModel, Evaluation, StageChoice
from hppctl.planner.registry import DESCRIPTIONS, STRATEGIES, Candidate
from hppctl.planner import strategies as _strategies  # noqa: F401  (registers the strategies)

DEFAULT_STRATEGY = "asteroid"


def cost_model(profile: Profile, request: PlanRequest, *, within_profile: bool = False) -> CostModel:
    return CostModel(profile, micro_batch=request.micro_batch, num_micro_batches=request.num_micro_batches,
                     within_profile=within_profile)


def run_strategy(profile: Profile, request: PlanRequest, name: str, *, within_profile: bool = False,
                 ) -> tuple[Candidate | None, CostModel, float]:
    """`name`'s candidate for `request`; with `within_profile` no device gets more samples per micro-batch
    than the profile measured it at (`CostModel.ceiling`)."""
    if name not in STRATEGIES:
        raise BadInput(f"--strategy: unknown strategy {name!r} (known: {', '.join(sorted(STRATEGIES))})")
    cm = cost_model(profile, request, within_profile=within_profile)
    started = time.perf_counter()
    with progress.within(name):
        candidate = STRATEGIES[name](cm)
    return candidate, cm, time.perf_counter() - started


def make_plan(profile: Profile, request: PlanRequest, strategy: str = DEFAULT_STRATEGY) -> HppPlan:
    """Plan with one strategy; raises Infeasible (naming device and missing bytes) if nothing fits."""
    candidate, cm, elapsed = run_strategy(profile, request, strategy)
    if candidate is None:
        raise Infeasible(explain_infeasible(profile, request))
    return to_plan(cm, profile, request, strategy, candidate, elapsed)


def to_plan(cm: CostModel, profile: Profile, request: PlanRequest, strategy: str, candidate: Candidate,
            elapsed: float) -> HppPlan:
    if candidate.build_plan is not None:
        return candidate.build_plan(request, strategy, elapsed)
    schedule = candidate.schedule
    ev = cm.evaluate(candidate.stages, schedule)
    P = len(candidate.stages)
    warmup = WARMUP_POLICIES[schedule]
    stages = [
        StagePlan(
            layers=[s.start, s.end],
            devices=[cm.names[d] for d in s.devices],
            samples=list(s.samples),
            warmup=warmup(P, p, cm.M),
            forward_s=ev.steps[2 * p].forward_s,
            backward_s=ev.steps[2 * p].backward_s,
            allreduce_s=ev.steps[2 * p].allreduce_s,
            allreduce_exposed_s=ev.steps[2 * p].exposed_allreduce_s if len(s.devices) > 1 else None,
            allreduce_buckets=ev.steps[2 * p].buckets if len(s.devices) > 1 else None,
            memory_bytes=list(ev.memory_bytes[p]),
            memory_budget_bytes=[cm.budget[d] for d in s.devices],
        )
        for p, s in enumerate(candidate.stages)
    ]
    transfers = [
        TransferPlan(after_stage=p, bytes_per_micro_batch=cm.B * cm.boundary[s.end - 1],
                     forward_s=ev.steps[2 * p + 1].forward_s, backward_s=ev.steps[2 * p + 1].backward_s)
        for p, s in enumerate(candidate.stages[:-1])
    ]
    return HppPlan(
        strategy=strategy, model=profile.model, model_input=profile.model_input, granularity=profile.granularity,
        profile_digest=cm.profile_digest,
        global_batch=request.global_batch, micro_batch=request.micro_batch, num_micro_batches=request.num_micro_batches,
        schedule=schedule, stages=stages, transfers=transfers,
        prediction=Prediction(
            round_latency_s=ev.round_latency_s,
            throughput_samples_per_s=request.global_batch / ev.round_latency_s if ev.round_latency_s > 0 else 0.0,
            dominant_step=ev.dominant_step,
            peak_memory_ratio=peak_memory_ratio(cm, candidate.stages, ev),
        ),
        memory_violations=violations(cm, candidate.stages, ev),
        planning_time_s=elapsed,
    )


def peak_memory_ratio(cm: CostModel, stages: list[StageChoice], ev: Evaluation) -> float:
    return max(mem / cm.budget[d] for s, row in zip(stages, ev.memory_bytes) for d, mem in zip(s.devices, row))


def violations(cm: CostModel, stages: list[StageChoice], ev: Evaluation) -> list[MemoryViolation]:
    return [MemoryViolation(device=cm.names[d], stage=p, needed_bytes=mem, budget_bytes=cm.budget[d])
            for p, (s, row) in enumerate(zip(stages, ev.memory_bytes))
            for d, mem in zip(s.devices, row) if mem > cm.budget[d]]


def explain_infeasible(profile: Profile, request: PlanRequest, hint: str = "try a smaller --micro-batch") -> str:
    """Name the device and the bytes missing in the least-short layout we know of.

    Candidates are the memory-blind planners' layouts (pipedream, dapple) and the whole model on
    the largest device; the one whose worst device misses the fewest bytes is reported.
    """
    cm = cost_model(profile, request)
    shortfalls: list[tuple[int, str, int]] = []
    for name in ("pipedream", "dapple"):
        candidate = STRATEGIES[name](cm)
        if candidate is None:
            continue
        ev = cm.evaluate(candidate.stages)
        worst = max(((need - cm.budget[d], cm.names[d], need) for s, row in zip(candidate.stages, ev.memory_bytes)
                     for d, need in zip(s.devices, row)))
        shortfalls.append(worst)
    biggest = max(range(len(cm.names)), key=lambda d: cm.budget[d])
    whole = cm.memory(0, cm.num_layers, cm.B, 1)
    shortfalls.append((whole - cm.budget[biggest], cm.names[biggest], whole))
    missing, device, need = min(s for s in shortfalls if s[0] > 0) if any(s[0] > 0 for s in shortfalls) else max(shortfalls)
    return (f"no plan fits the memory budgets (global batch {request.global_batch}, micro-batch "
            f"{request.micro_batch}): at best device {device} needs {format_bytes(need)} and has "
            f"{format_bytes(need - missing)} ({format_bytes(max(missing, 0))} missing); {hint}")


def strategy_names() -> list[str]:
    return list(STRATEGIES)


def describe(name: str) -> str:
    return DESCRIPTIONS[name]


class CompareRow:
    """One strategy's result on a shared request (`hppctl plan --compare`)."""

    def __init__(self, strategy: str, plan: HppPlan | None, planning_time_s: float,
                 simulated_round_latency_s: float | None = None):
        self.strategy, self.plan, self.planning_time_s = strategy, plan, planning_time_s
        self.simulated_round_latency_s = simulated_round_latency_s
        """The schedule replayed by `hppctl.schedule` (None when compare ran without a simulator)."""

    @property
    def feasible(self) -> bool:
        return self.plan is not None and not self.plan.memory_violations

    @property
    def throughput(self) -> float:
        return self.plan.prediction.throughput_samples_per_s if self.plan else 0.0

    @property
    def simulated_throughput(self) -> float | None:
        sim = self.simulated_round_latency_s
        return None if sim is None else (self.plan.global_batch / sim if self.plan and sim > 0 else 0.0)

    @property
    def round_latency_s(self) -> float:
        return self.plan.prediction.round_latency_s if self.plan else math.inf

    @property
    def peak_memory_ratio(self) -> float:
        return self.plan.prediction.peak_memory_ratio if self.plan else math.inf

    @property
    def shape(self) -> str:
        """Stages as device counts, e.g. '3+1+1' (head first)."""
        return "+".join(str(len(s.devices)) for s in self.plan.stages) if self.plan else "-"

    def as_json(self) -> dict:
        return {
            "strategy": self.strategy, "feasible": self.feasible, "throughput": self.throughput,
            "micro_batch": self.plan.micro_batch if self.plan else None,
            "micro_batch_choice": self.plan.micro_batch_choice.model_dump(mode="json")
            if self.plan and self.plan.micro_batch_choice else None,
            "round_latency_s": self.round_latency_s if self.plan else None,
            "simulated_throughput": self.simulated_throughput,
            "simulated_round_latency_s": self.simulated_round_latency_s,
            "peak_memory_ratio": self.peak_memory_ratio if self.plan else None,
            "stages": [{"layers": s.layers, "devices": s.devices, "samples": s.samples} for s in self.plan.stages]
            if self.plan else None,
            "planning_time_s": self.planning_time_s,
        }


def compare(profile: Profile, request: PlanRequest,
            simulate: Callable[[HppPlan], float] | None = None) -> list[CompareRow]:
    """Every registered strategy on the same profile and request, fastest feasible first.

    `simulate(plan) -> round latency` (e.g. `hppctl.schedule.simulated_round_latency(profile)`; the
    planner does not import the simulator) adds the simulated figure, and then rows rank by it.
    """
    # every other strategy in a forked child where `hppctl plan` allows it (planner/forked.py)
    rows = forked.map_split_if_allowed(lambda: functools.partial(_compare_row, profile, request, simulate),
                                       list(STRATEGIES))
    return rank_rows(rows, simulate is not None)


def _compare_row(profile: Profile, request: PlanRequest, simulate: Callable[[HppPlan], float] | None,
                 name: str) -> CompareRow:
    candidate, cm, elapsed = run_strategy(profile, request, name)
    plan = to_plan(cm, profile, request, name, candidate, elapsed) if candidate else None
    return CompareRow(name, plan, elapsed, simulate(plan) if simulate and plan else None)


def rank_rows(rows: list[CompareRow], simulated: bool) -> list[CompareRow]:
    """Feasible first, then the fastest (by the simulated figure when there is one), then a fixed order."""
    preference = {name: i for i, name in enumerate(("asteroid", "asteroid-paper", "dp", "pp", "pipedream", "dapple"))}
    speed = (lambda r: r.simulated_throughput or 0.0) if simulated else (lambda r: r.throughput)
    return sorted(rows, key=lambda r: (not r.feasible, -speed(r), preference.get(r.strategy, 99)))
