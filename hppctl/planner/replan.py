"""Re-planning after a device is lost (Asteroid §3.4, notes §5): light and heavy.

Light ("layer-wise lightweight pipeline re-planning"): keep the surviving stages and their
device groups, drop the lost device, and move the partition points so that each remaining
stage's share of the model's forward FLOPs is proportional to its compute capacity (FLOP/s
of its devices on its current layers) — the paper's rule. Then re-run Algorithm 1 in every
stage (K follows the new stage count), polish the cuts one layer at a time on the profiled
times (our addition: FLOPs alone misjudge depthwise layers and per-kernel overheads), and check
every memory budget; if anything does not fit, fall back to heavy.

Heavy ("straw-man rescheduling"): the full planner on the surviving devices, from scratch.

Both return a plan over a profile without the lost device, and the layer migrations the new
plan needs (which layers each device must receive and from whom).
"""

from __future__ import annotations

from dataclasses import dataclass

from hppctl.errors import BadInput, Infeasible
from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.models.profile import Profile
from hppctl.planner import DEFAULT_STRATEGY, cost_model, make_plan, to_plan
from hppctl.planner.allocation import allocate
from hppctl.planner.cost import CostModel, StageChoice, asteroid_warmup
from hppctl.planner.registry import Candidate


@dataclass(frozen=True)
class Migration:
    """Layers [start, end) that `device` must hold in the new plan and did not hold before.

    `source` is a device that held them in the old plan and survives, or None when their only
    holder was the lost device (they then come from its backup).
    """

    device: str
    start: int
    end: int
    source: str | None


@dataclass(frozen=True)
class Replan:
    plan: HppPlan
    profile: Profile
    migrations: list[Migration]
    method: str  # "light" or "heavy"
    fallback_reason: str = ""


def without_device(profile: Profile, lost: str) -> Profile:
    """The profile of the surviving devices (links to the lost one dropped)."""
    if lost not in {d.name for d in profile.devices}:
        raise BadInput(f"device {lost!r} is not in the profile")
    if len(profile.devices) == 1:
        raise Infeasible(f"device {lost!r} was the last device: nothing is left to train on")
    return profile.model_copy(update={
        "devices": [d for d in profile.devices if d.name != lost],
        "links": [link for link in profile.links if lost not in link.between],
    })


def replan_light(plan: HppPlan, profile: Profile, lost: str) -> Replan:
    survivors = without_device(profile, lost)
    request = PlanRequest(global_batch=plan.global_batch, micro_batch=plan.micro_batch, schedule=plan.schedule)
    cm = cost_model(survivors, request)
    index = {name: i for i, name in enumerate(cm.names)}
    groups = [tuple(index[d] for d in s.devices if d != lost) for s in plan.stages]
    ranges = [(s.start, s.end) for s in plan.stages]
    kept = [(g, r) for g, r in zip(groups, ranges) if g]
    capacities = [stage_capacity(cm, g, start, end) for g, (start, end) in kept]
    cuts = flops_proportional_cuts(survivors, capacities)
    stages = _allocate_stages(cm, [g for g, _ in kept], cuts)
    if stages is not None and cm.evaluate(stages, plan.schedule).feasible:
        # FLOPs are a rough proxy for time (depthwise convolutions, per-kernel overheads): polish
        # the cuts on the profiled times, one layer at a time, still without regrouping devices
        from hppctl.planner.strategies.asteroid import refine_cuts

        stages = refine_cuts(cm, stages)
    if stages is None or not cm.evaluate(stages, plan.schedule).feasible:
        heavy = replan_heavy(plan, profile, lost)
        return Replan(heavy.plan, heavy.profile, heavy.migrations, "heavy",
                      "the light plan does not fit the memory budgets")
    new_plan = to_plan(cm, survivors, request, "asteroid-replan", Candidate(stages, plan.schedule), 0.0)
    return Replan(new_plan, survivors, migrations(plan, new_plan, lost), "light")


def replan_heavy(plan: HppPlan, profile: Profile, lost: str, strategy: str = DEFAULT_STRATEGY) -> Replan:
    survivors = without_device(profile, lost)
    request = PlanRequest(global_batch=plan.global_batch, micro_batch=plan.micro_batch, schedule=plan.schedule)
    new_plan = make_plan(survivors, request, strategy)
    return Replan(new_plan, survivors, migrations(plan, new_plan, lost), "heavy")


def stage_capacity(cm: CostModel, group: tuple[int, ...], start: int, end: int) -> float:
    """FLOP/s of a device group on layers [start, end) at the full micro-batch (Eq. 9, in FLOPs)."""
    flops = cm.B * sum(layer.forward_flops_per_sample for layer in cm.profile.layers[start:end])
    total = 0.0
    for d in group:
        seconds = cm.forward_time(d, start, end, cm.B) + cm.backward_time(d, start, end, cm.B)
        total += flops / seconds if seconds > 0 else 0.0
    return total


def flops_proportional_cuts(profile: Profile, capacities: list[float]) -> list[int]:
    """Boundaries [0, c1, ..., L] with stage s's FLOPs share ~ capacity share; >= 1 layer each.

    Each boundary goes to the prefix point closest to its cumulative target (notes §5).
    """
    flops = [max(layer.forward_flops_per_sample, 0) for layer in profile.layers]
    L, P = len(flops), len(capacities)
    if P > L:
        raise Infeasible(f"{P} stages cannot share {L} layers")
    prefix = [0]
    for f in flops:
        prefix.append(prefix[-1] + f)
    total_capacity = sum(capacities) or 1.0
    cuts, cumulative = [0], 0.0
    for s in range(P - 1):
        cumulative += capacities[s] / total_capacity * prefix[-1]
        low, high = cuts[-1] + 1, L - (P - 1 - s)  # leave one layer for every later stage
        best = min(range(low, high + 1), key=lambda c: (abs(prefix[c] - cumulative), c))
        cuts.append(best)
    cuts.append(L)
    return cuts


def _allocate_stages(cm: CostModel, groups: list[tuple[int, ...]], cuts: list[int]) -> list[StageChoice] | None:
    P, stages = len(groups), []
    for p, group in enumerate(groups):
        samples = allocate(cm, list(group), cuts[p], cuts[p + 1], asteroid_warmup(P, p, cm.M))
        if samples is None:
            return None
        stages.append(StageChoice(cuts[p], cuts[p + 1], group, tuple(samples)))
    return stages


def migrations(old: HppPlan, new: HppPlan, lost: str) -> list[Migration]:
    """For every device of the new plan, the layer runs it must fetch, and from whom."""
    holders: dict[int, list[str]] = {}
    for stage in old.stages:
        for layer in range(stage.start, stage.end):
            holders[layer] = [d for d in stage.devices if d != lost]
    held = {d: set(range(s.start, s.end)) for s in old.stages for d in s.devices}
    moves: list[Migration] = []
    for stage in new.stages:
        for device in stage.devices:
            need = [layer for layer in range(stage.start, stage.end) if layer not in held.get(device, set())]
            moves.extend(_runs(device, need, holders))
    return moves


def _runs(device: str, layers: list[int], holders: dict[int, list[str]]) -> list[Migration]:
    """Group consecutive layers with the same source into one migration."""
    out: list[Migration] = []
    for layer in layers:
        source = holders[layer][0] if holders[layer] else None
        last = out[-1] if out else None
        if last and last.end == layer and last.source == source:
            out[-1] = Migration(device, last.start, layer + 1, source)
        else:
            out.append(Migration(device, layer, layer + 1, source))
    return out


def backup_targets(plan: HppPlan) -> dict[str, str | None]:
    """Topology-driven replication: who keeps a copy of each device's stage.

    A single-device stage backs up to the first device of the next stage (the last stage to the
    first stage); a device of a replicated stage needs no backup (its replicas hold the same
    weights after every AllReduce), shown as None.
    """
    targets: dict[str, str | None] = {}
    P = len(plan.stages)
    for p, stage in enumerate(plan.stages):
        for device in stage.devices:
            if len(stage.devices) > 1:
                targets[device] = None
            elif P > 1:
                targets[device] = plan.stages[(p + 1) % P].devices[0]
            else:
                targets[device] = None
    return targets
