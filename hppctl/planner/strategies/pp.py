"""`pp`: pipeline parallelism, one device per stage, GPipe-style compute-balanced partition.

As in the paper's evaluation, the baseline gets heterogeneity-aware balancing (each stage's
layers are chosen so the slowest stage's compute is minimal on its own device) and runs with
Asteroid's 1F1B. Like GPipe, the partition ignores the size of activations at the cuts.
Stages respect memory budgets. Its strongest honest form tries every pipeline depth k on the
k fastest devices (placed in memory order, largest first, as the head holds most activations).
"""

from __future__ import annotations

import numpy as np

from hppctl.planner.cost import CostModel, StageChoice, asteroid_warmup
from hppctl.planner.registry import Candidate, strategy
from hppctl.planner.strategies.dp import fastest_first
from hppctl.planner.vector_alloc import tables_for


def balanced_partition(cm: CostModel, devices: list[int]) -> list[StageChoice] | None:
    """Min-max contiguous partition of the layers over `devices` in order, one device each."""
    L, P = cm.num_layers, len(devices)
    if P > L:
        return None
    # cost[p][i, j]: time of layers [i, j) on stage p's device at B, inf if it does not fit memory
    best = np.full(L + 1, np.inf)
    best[0] = 0.0
    back = np.zeros((P, L + 1), dtype=np.int64)
    for p, d in enumerate(devices):
        warmup = asteroid_warmup(P, p, cm.M)
        cost = _stage_costs(cm, d, warmup)
        cand = np.maximum(best[:, None], cost)  # cand[i, j]
        back[p] = cand.argmin(axis=0)
        best = cand.min(axis=0)
    if not np.isfinite(best[L]):
        return None
    cuts, j = [L], L
    for p in range(P - 1, -1, -1):
        j = int(back[p][j])
        cuts.append(j)
    cuts.reverse()
    return [StageChoice(cuts[p], cuts[p + 1], (d,), (cm.B,)) for p, d in enumerate(devices)]


def _stage_costs(cm: CostModel, d: int, warmup: int) -> np.ndarray:
    """cost[i, j] = forward + backward of layers [i, j) on device d at batch B; inf if it does not fit."""
    L = cm.num_layers
    tables = tables_for(cm)
    i, j = np.triu_indices(L + 1, k=1)
    key = ("pp_stage_time", d)
    if key not in cm.__dict__:  # pp tries many depths: the time of each device's ranges is reused
        fwd, bwd = tables.times(np.full(i.shape, d), i, j, np.full(i.shape, float(cm.B)))
        cm.__dict__[key] = fwd + bwd
    fits = tables.caps(np.array([d]), i, j, warmup)[0] >= cm.B
    cost = np.full((L + 1, L + 1), np.inf)
    cost[i, j] = np.where(fits, cm.__dict__[key], np.inf)
    return cost


@strategy("pp", "pipeline parallel: one device per stage, GPipe compute-balanced partition, 1F1B")
def plan_pp(cm: CostModel) -> Candidate | None:
    order = fastest_first(cm)
    best, best_latency = None, float("inf")
    for k in range(min(2, len(order)), min(len(order), cm.num_layers) + 1):
        chosen = sorted(order[:k], key=lambda d: (-cm.budget[d], order.index(d)))
        stages = balanced_partition(cm, chosen)
        if stages is None:
            continue
        latency = cm.evaluate(stages).round_latency_s
        if latency < best_latency:
            best, best_latency = stages, latency
    return Candidate(best) if best else None
