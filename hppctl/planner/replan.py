"""Re-planning after a device is lost (Asteroid §3.4, notes §5): light and heavy.

Light ("layer-wise lightweight pipeline re-planning"): keep the surviving stages and their
device groups, drop the lost device, and move the partition points so that each remaining
stage's share of the model's forward FLOPs is proportional to its compute capacity (FLOP/s
of its devices on its current layers) — the paper's rule. Then re-run Algorithm 1 in every
stage (K follows the new stage count), polish the cuts one layer at a time on the profiled
times (our addition: FLOPs alone misjudge depthwise layers and per-kernel overheads), and check
every memory budget; if anything does not fit, fall back to heavy.

Heavy ("straw-man rescheduling"): the full planner on the surviving devices, from scratch.

Both return a plan over a profile without the lost devices, and the layer migrations the new
plan needs (which layers each device must receive and from whom). Devices lost together (a power
strip, a switch: one seen while the re-plan for the other was being prepared) are dropped at once.
A split-backward plan is re-planned with split backwards too when the survivors allow it
(`keeping_split_backward`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from hppctl.errors import BadInput, Infeasible
from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.models.profile import Profile
from hppctl.planner import DEFAULT_STRATEGY, cost_model, make_plan, to_plan
from hppctl.planner.allocation import allocate
from hppctl.planner.cost import CostModel, StageChoice, asteroid_warmup
from hppctl.planner.registry import Candidate
from hppctl.planner.split_backward import with_split_backward


@dataclass(frozen=True)
class Migration:
    """Layers [start, end) that `device` must hold in the new plan and did not hold before.

    `source` is a device that held them in the old plan and survives, or None when every holder was
    lost: `backup_of` then names the lost device whose backup holds them (None when the old stage
    was replicated: replicas keep no backups, so the layers are gone).
    """

    device: str
    start: int
    end: int
    source: str | None
    backup_of: str | None = None


@dataclass(frozen=True)
class Replan:
    plan: HppPlan
    profile: Profile
    migrations: list[Migration]
    method: str  # "light" or "heavy"
    fallback_reason: str = ""
    split_dropped: str = ""
    """Why a split-backward plan's re-plan runs whole backwards ("" when it splits, or never did)."""


def keeping_split_backward(old: HppPlan, result: Replan) -> Replan:
    """`result` with split backwards when `old` had them: the run keeps the schedule it was planned
    with, each new stage deferring its weight gradients by the survivors' profiled times. Cuts and
    devices stay the re-planner's (the migrations were computed for them): split backwards change
    when each stage's work runs, not which layers it holds. Whole backwards, saying why, when the
    survivors' profile has no weight-gradient times or a stage would not fit its memory budget with
    the micro-batches its deferred weight gradients keep."""
    if not old.split_backward:
        return result
    try:
        split = with_split_backward(result.plan, result.profile)
    except (ValueError, Infeasible) as e:  # the planner's advice to plan without the flag does not apply here
        return replace(result, split_dropped=str(e).removesuffix(": plan without --split-backward"))
    return replace(result, plan=split)


def lost_devices(lost: str | Collection[str]) -> tuple[str, ...]:
    """One lost device (a name) or several, as a tuple of names."""
    return (lost,) if isinstance(lost, str) else tuple(lost)


def without_devices(profile: Profile, lost: str | Collection[str]) -> Profile:
    """The profile of the surviving devices (links to the lost ones dropped)."""
    lost = lost_devices(lost)
    names = {d.name for d in profile.devices}
    for device in lost:
        if device not in names:
            raise BadInput(f"device {device!r} is not in the profile")
    if names <= set(lost):
        raise Infeasible(f"{', '.join(lost)} {'was' if len(lost) == 1 else 'were'} the last "
                         f"device{'s' * (len(lost) > 1)}: nothing is left to train on")
    return profile.model_copy(update={
        "devices": [d for d in profile.devices if d.name not in lost],
        "links": [link for link in profile.links if not set(link.between) & set(lost)],
    })


def replan_light(plan: HppPlan, profile: Profile, lost: str | Collection[str]) -> Replan:
    lost = lost_devices(lost)
    survivors = without_devices(profile, lost)
    request = PlanRequest(global_batch=plan.global_batch, micro_batch=plan.micro_batch, schedule=plan.schedule)
    cm = cost_model(survivors, request)
    index = {name: i for i, name in enumerate(cm.names)}
    groups = [tuple(index[d] for d in s.devices if d not in lost) for s in plan.stages]
    ranges = [(s.start, s.end) for s in plan.stages]
    kept = [(g, r) for g, r in zip(groups, ranges) if g]
    capacities = [stage_capacity(cm, g, start, end) for g, (start, end) in kept]
    cuts = flops_proportional_cuts(survivors, capacities)
    stages = _allocate_stages(cm, [g for g, _ in kept], cuts)
    stages = _best_feasible(cm, plan.schedule, [stages, cut_points_dp(cm, [g for g, _ in kept])])
    if stages is not None:
        # FLOPs are a rough proxy for time (depthwise convolutions, per-kernel overheads) and the DP
        # leaves AllReduce out: polish the cuts on the profiled times, one
        # layer at a time, still without regrouping devices
        from hppctl.planner.strategies.asteroid import refine_cuts

        stages = refine_cuts(cm, stages)
    if stages is None or not cm.evaluate(stages, plan.schedule).feasible:
        heavy = replan_heavy(plan, profile, lost)
        return replace(heavy, fallback_reason="the light plan does not fit the memory budgets")
    new_plan = to_plan(cm, survivors, request, "asteroid-replan", Candidate(stages, plan.schedule), 0.0)
    return keeping_split_backward(plan, Replan(new_plan, survivors, migrations(plan, new_plan, lost), "light"))


def replan_heavy(plan: HppPlan, profile: Profile, lost: str | Collection[str],
                 strategy: str = DEFAULT_STRATEGY) -> Replan:
    lost = lost_devices(lost)
    survivors = without_devices(profile, lost)
    request = PlanRequest(global_batch=plan.global_batch, micro_batch=plan.micro_batch, schedule=plan.schedule)
    new_plan = make_plan(survivors, request, strategy)
    return keeping_split_backward(plan, Replan(new_plan, survivors, migrations(plan, new_plan, lost), "heavy"))


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


def cut_points_dp(cm: CostModel, groups: list[tuple[int, ...]]) -> list[StageChoice] | None:
    """Cut points for stages with fixed device groups, in order, minimising Eq. 4's C exactly.

    The round's critical value is C = max_s [M·x_s + sum_{i<s} x_i] over the steps x (stages and the
    transfers between them, each E_f + E_b). Read from the tail, F_s = max(M·x_s, x_s + F_{s+1}) and
    C = F_0; F_s only grows with F_{s+1}, so a DP over (stage, first layer) keeping the smallest
    F of each suffix is exact. A stage's step uses Algorithm 1's split (a single device takes the
    whole micro-batch); memory budgets rule ranges out. About P·L²/2 stage evaluations (10^4 for
    MobileNetV2 on three stages). AllReduce terms are left to the exact evaluation that follows.
    """
    L, P, M = len(cm.profile.layers), len(groups), cm.M
    if P > L:
        return None
    inf = float("inf")
    best = [[inf] * (L + 1) for _ in range(P)]
    """best[p][a]: the smallest F of stages p..P-1 covering layers [a, L)."""
    choice: list[list[StageChoice | None]] = [[None] * (L + 1) for _ in range(P)]
    for p in range(P - 1, -1, -1):
        warmup = asteroid_warmup(P, p, cm.M)
        for a in ([0] if p == 0 else range(p, L - (P - 1 - p))):
            for b in ([L] if p == P - 1 else range(a + 1, L - (P - 2 - p))):
                after = -inf
                if p < P - 1:
                    if best[p + 1][b] == inf:
                        continue
                    transfer = 2 * cm.transfer_time(b, groups[p], groups[p + 1])
                    after = max(M * transfer, transfer + best[p + 1][b])
                stage = _stage_on(cm, groups[p], a, b, warmup)
                if stage is None:
                    continue
                step = cm.stage_step(stage)
                x = step.forward_s + step.backward_s
                value = max(M * x, x + after)
                if value < best[p][a]:
                    best[p][a], choice[p][a] = value, stage
    if best[0][0] == inf:
        return None
    stages, a = [], 0
    for p in range(P):
        stages.append(choice[p][a])
        a = choice[p][a].end
    return stages


def _stage_on(cm: CostModel, group: tuple[int, ...], start: int, end: int, warmup: int) -> StageChoice | None:
    if len(group) == 1:
        fits = cm.memory(start, end, cm.B, warmup) <= cm.budget[group[0]]
        return StageChoice(start, end, group, (cm.B,)) if fits else None
    samples = allocate(cm, list(group), start, end, warmup)
    return None if samples is None else StageChoice(start, end, group, tuple(samples))


def _best_feasible(cm: CostModel, schedule: str, candidates: list[list[StageChoice] | None]) -> list[StageChoice] | None:
    scored = [(cm.evaluate(c, schedule).round_latency_s, i, c) for i, c in enumerate(candidates)
              if c is not None and cm.evaluate(c, schedule).feasible]
    return min(scored)[2] if scored else None


def _allocate_stages(cm: CostModel, groups: list[tuple[int, ...]], cuts: list[int]) -> list[StageChoice] | None:
    P, stages = len(groups), []
    for p, group in enumerate(groups):
        samples = allocate(cm, list(group), cuts[p], cuts[p + 1], asteroid_warmup(P, p, cm.M))
        if samples is None:
            return None
        stages.append(StageChoice(cuts[p], cuts[p + 1], group, tuple(samples)))
    return stages


def migrations(old: HppPlan, new: HppPlan, lost: str | Collection[str]) -> list[Migration]:
    """For every device of the new plan, the layer runs it must fetch, and from whom."""
    lost = lost_devices(lost)
    origin: dict[int, tuple[str | None, str | None]] = {}
    """Per layer: (a surviving holder, None) or (None, the lost device whose backup holds it)."""
    for stage in old.stages:
        alive = [d for d in stage.devices if d not in lost]
        only = stage.devices[0] if len(stage.devices) == 1 else None
        for layer in range(stage.start, stage.end):
            origin[layer] = (alive[0], None) if alive else (None, only)
    held = {d: set(range(s.start, s.end)) for s in old.stages for d in s.devices}
    moves: list[Migration] = []
    for stage in new.stages:
        for device in stage.devices:
            need = [layer for layer in range(stage.start, stage.end) if layer not in held.get(device, set())]
            moves.extend(_runs(device, need, origin))
    return moves


def _runs(device: str, layers: list[int], origin: dict[int, tuple[str | None, str | None]]) -> list[Migration]:
    """Group consecutive layers with the same origin into one migration (two lost stages' layers, next
    to each other, come from two backups: two migrations)."""
    out: list[Migration] = []
    for layer in layers:
        source, backup_of = origin[layer]
        last = out[-1] if out else None
        if last and last.end == layer and (last.source, last.backup_of) == (source, backup_of):
            out[-1] = Migration(device, last.start, layer + 1, source, backup_of)
        else:
            out.append(Migration(device, layer, layer + 1, source, backup_of))
    return out


def backup_targets(plan: HppPlan) -> dict[str, str | None]:
    """Topology-driven replication: who keeps a copy of each device's stage (`backup_ring`)."""
    return backup_ring([list(s.devices) for s in plan.stages])


def backup_ring(stages: list[list[str]]) -> dict[str, str | None]:
    """For stages given as device lists: a single-device stage backs up to the first device of the next
    stage (the last stage to the first stage); a device of a replicated stage needs no backup (its
    replicas hold the same weights after every AllReduce), shown as None.
    """
    targets: dict[str, str | None] = {}
    P = len(stages)
    for p, devices in enumerate(stages):
        for device in devices:
            targets[device] = stages[(p + 1) % P][0] if len(devices) == 1 and P > 1 else None
    return targets
