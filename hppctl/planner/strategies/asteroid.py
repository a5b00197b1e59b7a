"""`asteroid-paper` (Algorithms 1 + 2 exactly as published) and `asteroid` (the same, improved).

`asteroid` keeps the best, under the same cost model, of:
- the paper's DP result (so it is never worse than `asteroid-paper`);
- the same DP tables read with fewer devices (the paper always uses all N; a slow or
  memory-poor device can cost more than it brings);
- the DP run on a second device order (fastest first), which the paper's memory-first
  order can miss when memory and speed disagree;
- the `dp` and `pp` baselines' plans, so it never loses to either;
- a local search that moves each cut one layer at a time while the round gets shorter.
"""

from __future__ import annotations

import math

from hppctl.planner import progress
from hppctl.planner.allocation import allocate

from hppctl.planner.asteroid import AsteroidDP, memory_order, solve, speed_order
from hppctl.planner.coarsen import coarsen, refine_stages
from hppctl.planner.cost import CostModel, StageChoice, asteroid_warmup
from hppctl.planner.registry import Candidate, strategy
from hppctl.planner.strategies.dp import plan_dp
from hppctl.planner.strategies.pp import balanced_partition, plan_pp


def in_space_bound(cm: CostModel, order: list[int]) -> float:
    """Latency of two plans inside the paper DP's own search space: one-stage DP and one device per stage.

    Used only to prune the DP (see `AsteroidDP`); `solve` re-runs unpruned if the DP's answer is worse.
    """
    bounds = [math.inf]
    samples = allocate(cm, order, 0, cm.num_layers, 1)
    if samples is not None:
        bounds.append(cm.evaluate([StageChoice(0, cm.num_layers, tuple(order), tuple(samples))]).round_latency_s)
    chain = balanced_partition(cm, order)
    if chain is not None:
        bounds.append(cm.evaluate(chain).round_latency_s)
    bounds.append(coarse_bound(cm, order, min(bounds)))
    return min(bounds)


COARSE_LAYERS = 48


def coarse_bound(cm: CostModel, order: list[int], bound: float) -> float:
    """Solve the DP on ~48 super-layers first: its plan is a fine plan too, usually close to the answer."""
    size = -(-cm.num_layers // COARSE_LAYERS)
    if size <= 1:
        return math.inf
    coarse_profile, starts = coarsen(cm.profile, size)
    coarse = CostModel(coarse_profile, micro_batch=cm.B, num_micro_batches=cm.M,
                       within_profile=cm.within_profile)
    with progress.within("coarse plan"):
        _, result = solve(coarse, order, bound)
    stages = refine_stages(cm, result.stages, starts) if result else None
    if stages is None:
        return math.inf
    evaluation = cm.evaluate(stages)
    return evaluation.round_latency_s if evaluation.feasible else math.inf


@strategy("asteroid", "Asteroid's planner plus device dropping, a second device order and local search")
def plan_asteroid(cm: CostModel) -> Candidate | None:
    candidates: list[list[StageChoice]] = []
    for name, baseline in (("dp", plan_dp), ("pp", plan_pp)):
        with progress.within(name):
            found = baseline(cm)
        if found:
            candidates.append(found.stages)
    order = memory_order(cm)
    with progress.within("bound"):
        bound = min([in_space_bound(cm, order)] + [cm.evaluate(c).round_latency_s for c in candidates])
    with progress.within("memory-order DP"):
        by_memory, paper = solve(cm, order, bound)
    candidates += [r.stages for r in (paper, by_memory.best()) if r]
    by_speed = speed_order(cm)
    if by_speed != order:
        # only a plan better than the best so far matters here, so prune with that
        best_so_far = min(cm.evaluate(c).round_latency_s for c in candidates) if candidates else bound
        with progress.within("speed-order DP"):
            stages = second_order_plan(cm, by_speed, min(bound, best_so_far))
        if stages:
            candidates.append(stages)
    if not candidates:
        return None
    best = min(candidates, key=lambda stages: cm.evaluate(stages).round_latency_s)
    with progress.within("moving cuts"):
        return Candidate(refine_cuts(cm, drop_idle_devices(best)))


def drop_idle_devices(stages: list[StageChoice]) -> list[StageChoice]:
    """Remove devices that Algorithm 1 gave no samples: they only slow the group's AllReduce."""
    return [StageChoice(s.start, s.end, tuple(d for d, y in zip(s.devices, s.samples) if y),
                        tuple(y for y in s.samples if y)) for s in stages]


@strategy("asteroid-paper", "Asteroid's planner exactly as published (Alg. 1 + Alg. 2, all devices)")
def plan_asteroid_paper(cm: CostModel) -> Candidate | None:
    order = memory_order(cm)
    _, result = solve(cm, order, in_space_bound(cm, order))
    return Candidate(result.stages) if result else None


FINE_SECOND_ORDER_LAYERS = 400


def second_order_plan(cm: CostModel, order: list[int], bound: float) -> list[StageChoice] | None:
    """The DP on another device order: on the fine layers when that is cheap, else on ~48
    super-layers mapped back to fine layers (the local search then polishes the cuts)."""
    if cm.num_layers <= FINE_SECOND_ORDER_LAYERS:
        result = AsteroidDP(cm, order, bound).best()
        return result.stages if result else None
    coarse_profile, starts = coarsen(cm.profile, -(-cm.num_layers // COARSE_LAYERS))
    coarse = CostModel(coarse_profile, micro_batch=cm.B, num_micro_batches=cm.M,
                       within_profile=cm.within_profile)
    # pruned by the bound as the fine DP above: a plan above it loses to the best so far anyway
    result = AsteroidDP(coarse, order, bound).best()
    if result is None:
        return None
    stages = refine_stages(cm, result.stages, starts)
    return stages if stages and cm.evaluate(stages).feasible else None


def refine_cuts(cm: CostModel, stages: list[StageChoice], max_rounds: int = 50) -> list[StageChoice]:
    """Hill-climb: move one cut by one layer (re-running Algorithm 1 on both sides) while it helps."""
    best, best_latency = stages, cm.evaluate(stages).round_latency_s
    for _ in range(max_rounds):
        improved = False
        for cut in range(len(best) - 1):
            for delta in (-1, 1):
                moved = _move_cut(cm, best, cut, delta)
                if moved is None:
                    continue
                evaluation = cm.evaluate(moved)
                if evaluation.feasible and evaluation.round_latency_s < best_latency * (1 - 1e-12):
                    best, best_latency, improved = moved, evaluation.round_latency_s, True
        if not improved:
            return best
    return best


def _move_cut(cm: CostModel, stages: list[StageChoice], cut: int, delta: int) -> list[StageChoice] | None:
    left, right = stages[cut], stages[cut + 1]
    boundary = left.end + delta
    if not (left.start < boundary < right.end):
        return None
    P = len(stages)
    new_left = _reallocate(cm, left.start, boundary, left.devices, asteroid_warmup(P, cut, cm.M))
    new_right = _reallocate(cm, boundary, right.end, right.devices, asteroid_warmup(P, cut + 1, cm.M))
    if new_left is None or new_right is None:
        return None
    return stages[:cut] + [new_left, new_right] + stages[cut + 2:]


def _reallocate(cm: CostModel, start: int, end: int, devices: tuple[int, ...], warmup: int) -> StageChoice | None:
    samples = allocate(cm, list(devices), start, end, warmup)
    return None if samples is None else StageChoice(start, end, devices, tuple(samples))
