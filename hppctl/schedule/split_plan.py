"""A plan's split-backward form, ranked and tuned by simulation (the estimate knows whole backwards only).

`split_backward_plan` turns a plan into its split form (planner/split_backward.py: the W seconds and
in-flight caps) and, by default, moves its cuts: the planner chose them to balance whole backwards,
but split, a stage's weight gradients fill idle time and its input half is what the pipeline
waits for, so a different balance can be faster. A greedy local search moves one cut at a time by
1, 2, 4 or 8 layers (samples and devices unchanged, memory checked by Eq. 3), keeps a move whose
split form simulates faster, and stops when none does or after MAX_REFINE_STEPS replays. The
plan's prediction is its simulated round.
"""

from __future__ import annotations

import time

from hppctl.errors import Infeasible
from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.models.profile import Profile
from hppctl.planner import cost_model, to_plan
from hppctl.planner.cost import CostModel, StageChoice
from hppctl.planner.registry import Candidate
from hppctl.planner.split_backward import with_split_backward
from hppctl.schedule.check import check_schedule
from hppctl.schedule.generate import schedule_for_plan
from hppctl.schedule.simulate import simulate
from hppctl.schedule.timings import ProfileTimings

MAX_REFINE_STEPS = 400
"""Replays the cut search may spend (each ~10 ms for 5 stages x 16 micro-batches; 50-100 suffice on Env B)."""
CUT_MOVES = (1, 2, 4, 8, -1, -2, -4, -8)


def split_backward_plan(plan: HppPlan, profile: Profile, *, refine: bool = True) -> HppPlan:
    """The plan with split backwards, its cuts tuned by simulation unless `refine` is off (raises
    ValueError if the profile has no weight-gradient times or the plan cannot split)."""
    started = time.perf_counter()
    request = PlanRequest(global_batch=plan.global_batch, micro_batch=plan.micro_batch, schedule=plan.schedule)
    cm = cost_model(profile, request)
    best = _split_and_simulate(plan, profile, cm)
    if refine and len(plan.stages) > 1:
        best = _refine_cuts(best, profile, request, cm)
    return best.model_copy(update={"planning_time_s": plan.planning_time_s + time.perf_counter() - started,
                                   "micro_batch_choice": plan.micro_batch_choice})


def _split_and_simulate(plan: HppPlan, profile: Profile, cm: CostModel) -> HppPlan:
    split = with_split_backward(plan, profile, cm)
    schedule = schedule_for_plan(split)
    check_schedule(schedule)
    latency = simulate(schedule, ProfileTimings(profile, schedule, cm=cm)).round_latency_s
    prediction = split.prediction.model_copy(update={
        "round_latency_s": latency, "throughput_samples_per_s": plan.global_batch / latency if latency > 0 else 0.0})
    return split.model_copy(update={"prediction": prediction})


def _refine_cuts(best: HppPlan, profile: Profile, request: PlanRequest, cm: CostModel) -> HppPlan:
    """Greedy first-improvement search over single cut moves (see the module docstring)."""
    index = {name: i for i, name in enumerate(cm.names)}
    stages = [StageChoice(s.layers[0], s.layers[1], tuple(index[d] for d in s.devices), tuple(s.samples))
              for s in best.stages]
    spent, improved = 0, True
    while improved and spent < MAX_REFINE_STEPS:
        improved = False
        for moved in _single_cut_moves(stages):
            if spent >= MAX_REFINE_STEPS:
                break
            if not cm.evaluate(moved, best.schedule).feasible:
                continue
            spent += 1
            plan = to_plan(cm, profile, request, best.strategy, Candidate(moved, best.schedule), 0.0)
            try:
                candidate = _split_and_simulate(plan, profile, cm)
            except Infeasible:  # the move fits whole backwards, not the split's held micro-batches
                continue
            if candidate.prediction.round_latency_s < best.prediction.round_latency_s * (1 - 1e-9):
                best, stages, improved = candidate, moved, True
                break
    return best


def _single_cut_moves(stages: list[StageChoice]):
    for i in range(len(stages) - 1):
        for step in CUT_MOVES:
            cut = stages[i].end + step
            if stages[i].start < cut < stages[i + 1].end:
                moved = list(stages)
                moved[i] = StageChoice(stages[i].start, cut, stages[i].devices, stages[i].samples)
                moved[i + 1] = StageChoice(cut, stages[i + 1].end, stages[i + 1].devices, stages[i + 1].samples)
                yield moved
