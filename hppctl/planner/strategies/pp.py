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
from hppctl.planner.forked import forked_map, worth_forking
from hppctl.planner.registry import Candidate, strategy
from hppctl.planner.strategies.dp import fastest_first
from hppctl.planner.vector_alloc import tables_for


def balanced_partition(cm: CostModel, devices: list[int]) -> list[StageChoice] | None:
    """Min-max contiguous partition of the layers over `devices` in order, one device each.

    Kept per device list: `asteroid` asks for the memory order's chain (its pruning bound) and
    `pp` for the same list as its deepest pipeline."""
    return balanced_partitions(cm, [devices])[0]


def balanced_partitions(cm: CostModel, device_lists: list[list[int]]) -> list[list[StageChoice] | None]:
    """`balanced_partition` of each list; those not kept yet are computed half in a forked child when
    the model is large (`forked.forked_map`: each partition reads only the cost model)."""
    cache = cm.__dict__.setdefault("pp_partitions", {})
    missing = list(dict.fromkeys(tuple(d) for d in device_lists if tuple(d) not in cache))
    if len(missing) > 1 and worth_forking(cm.num_layers * (cm.num_layers + 1) // 2):
        for d in sorted({d for devices in missing for d in devices}):
            _stage_time(cm, d)  # each device's once, before the fork: both sides read them
        found = forked_map(lambda: lambda devices: _min_max_partition(cm, list(devices)), missing)
    else:
        found = [_min_max_partition(cm, list(devices)) for devices in missing]
    cache.update(zip(missing, found))
    return [None if cache[tuple(d)] is None else list(cache[tuple(d)]) for d in device_lists]


def _min_max_partition(cm: CostModel, devices: list[int]) -> list[StageChoice] | None:
    L, P = cm.num_layers, len(devices)
    if P > L:
        return None
    pairs = _pairs_by_end(cm)
    best = np.full(L + 1, np.inf)
    best[0] = 0.0
    back = np.zeros((P, L + 1), dtype=np.int64)
    for p, d in enumerate(devices):
        # stage p ends at layer j: the best over its start i of max(best[i], cost[i, j]), first i on ties
        cand = np.maximum(best[pairs.start], _stage_costs(cm, d, asteroid_warmup(P, p, cm.M)))
        best = np.r_[np.inf, np.minimum.reduceat(cand, pairs.first)]
        hits = np.flatnonzero(cand == best[1:][pairs.segment])
        back[p, 1:] = pairs.start[hits[np.r_[True, pairs.segment[hits[1:]] != pairs.segment[hits[:-1]]]]]
    if not np.isfinite(best[L]):
        return None
    cuts, j = [L], L
    for p in range(P - 1, -1, -1):
        j = int(back[p][j])
        cuts.append(j)
    cuts.reverse()
    return [StageChoice(cuts[p], cuts[p + 1], (d,), (cm.B,)) for p, d in enumerate(devices)]


class _Pairs:
    """Every layer range [i, j), 0 <= i < j <= L, ordered by end j then start i: each end is one
    segment (`first` its positions, `segment` each pair's), so a min over starts is a reduceat."""

    def __init__(self, cm: CostModel):
        L, tables = cm.num_layers, tables_for(cm)
        j, i = np.tril_indices(L, k=0)
        self.start, self.end = i, j + 1
        self.first = (np.arange(L) * np.arange(1, L + 1)) // 2
        self.segment = j
        self.weights = cm.fixed_factor * (tables.param[self.end] - tables.param[self.start])
        received = np.where(self.start > 0, tables.boundary[np.maximum(self.start - 1, 0)], 0.0)
        self.activations = tables.act[self.end] - tables.act[self.start] + received


def _pairs_by_end(cm: CostModel) -> _Pairs:
    if "pp_pairs" not in cm.__dict__:
        cm.__dict__["pp_pairs"] = _Pairs(cm)
    return cm.__dict__["pp_pairs"]


def _stage_costs(cm: CostModel, d: int, warmup: int) -> np.ndarray:
    """Per pair (end-major): forward + backward of layers [i, j) on device d at batch B; inf if
    the whole micro-batch does not fit d's memory under `warmup` (`LayerTables.caps` >= B) or is past
    d's ceiling (`CostModel.ceiling`)."""
    pairs, tables = _pairs_by_end(cm), tables_for(cm)
    if cm.ceiling[d] < cm.B:  # the whole micro-batch is past what the profile measured d at
        return np.full(pairs.start.shape, np.inf)
    return np.where(_fits(cm, pairs, float(tables.budget[d]), warmup), _stage_time(cm, d), np.inf)


def _stage_time(cm: CostModel, d: int) -> np.ndarray:
    """Per pair (end-major): forward + backward of layers [i, j) on device d at batch B, kept: pp
    tries many depths, and each reuses the time of each device's ranges."""
    key = ("pp_stage_time", d)
    if key not in cm.__dict__:
        pairs, tables = _pairs_by_end(cm), tables_for(cm)
        i = pairs.start
        fwd, bwd = tables.times(np.full(i.shape, d), i, pairs.end, np.full(i.shape, float(cm.B)))
        cm.__dict__[key] = fwd + bwd
    return cm.__dict__[key]


def _fits(cm: CostModel, pairs: _Pairs, budget: float, warmup: int) -> np.ndarray:
    """Per pair: B samples fit a device of `budget` bytes under `warmup`; kept per (budget, warmup),
    which repeat across pipeline depths and devices of the same memory."""
    cache = cm.__dict__.setdefault("pp_fits", {})
    if (budget, warmup) not in cache:
        spare = budget - pairs.weights
        per = warmup * pairs.activations
        with np.errstate(divide="ignore", invalid="ignore"):
            fits = (spare >= 0) & ((per == 0) | (np.floor_divide(spare, np.where(per == 0, 1.0, per)) >= cm.B))
        if len(cache) * fits.size > 2**28:  # past 256 MB of masks, start over rather than grow
            cache.clear()
        cache[(budget, warmup)] = fits
    return cache[(budget, warmup)]


@strategy("pp", "pipeline parallel: one device per stage, GPipe compute-balanced partition, 1F1B")
def plan_pp(cm: CostModel) -> Candidate | None:
    order = fastest_first(cm)
    best, best_latency = None, float("inf")
    depths = range(min(2, len(order)), min(len(order), cm.num_layers) + 1)
    chains = [sorted(order[:k], key=lambda d: (-cm.budget[d], order.index(d))) for k in depths]
    for stages in balanced_partitions(cm, chains):
        if stages is None:
            continue
        latency = cm.evaluate(stages).round_latency_s
        if latency < best_latency:
            best, best_latency = stages, latency
    return Candidate(best) if best else None
