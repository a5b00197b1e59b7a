"""A method's `Timeline` -> the `PslPlan` file (seconds, names, memory, predictions). Pure."""

from __future__ import annotations

from hppctl.models.psl import (PslClientPrediction, PslHelperPlan, PslPiece, PslPlan, PslPrediction, PslRequest,
                               PslTimes)
from hppctl.planner.psl.instance import Instance, Timeline
from hppctl.planner.psl.memory import used_memory


def to_plan(timeline: Timeline, *, method: str, requested: str, model: str, granularity: str,
            request: PslRequest, times: PslTimes, instance: Instance, slot_s: float | None,
            solver_time_s: float, notes: list[str]) -> PslPlan:
    """`instance` is what the method solved (quantized when `slot_s` is set): its unit scales by slot_s."""
    unit = slot_s or 1.0
    clients, helpers = request.clients, request.helpers
    used = used_memory(instance, timeline.assignment)
    helper_plans = [
        PslHelperPlan(
            helper=h, clients=[clients[j] for j in range(len(clients)) if timeline.assignment[j] == i],
            memory_bytes=int(used[i]), memory_budget_bytes=int(instance.capacity[i]),
            sequence=[PslPiece(kind=pc.kind, client=clients[pc.client], fraction=min(1.0, pc.fraction),
                               start_s=pc.start * unit, end_s=pc.end * unit) for pc in timeline.pieces[i]],
        )
        for i, h in enumerate(helpers)
    ]
    path = instance.path()
    predictions = [
        PslClientPrediction(
            client=c, helper=helpers[int(timeline.assignment[j])],
            forward_done_s=float(timeline.forward_done[j]) * unit, completion_s=float(timeline.completion[j]) * unit,
            queueing_s=max(0.0, float(timeline.completion[j] - path[timeline.assignment[j], j]) * unit),
        )
        for j, c in enumerate(clients)
    ]
    prediction = PslPrediction(
        makespan_s=timeline.makespan * unit,
        makespan_slots=int(round(timeline.makespan)) if slot_s else None,
        lower_bound_s=Instance.from_times(times).lower_bound(), clients=predictions,
    )
    return PslPlan(
        method=method, requested_method=requested, model=model, granularity=granularity, batch=request.batch,
        clients=list(clients), helpers=list(helpers), cuts=[list(c) for c in request.cuts],
        assignment=[helpers[int(i)] for i in timeline.assignment], times=times, slot_s=slot_s,
        helper_plans=helper_plans, prediction=prediction, solver_time_s=solver_time_s, notes=notes,
    )
