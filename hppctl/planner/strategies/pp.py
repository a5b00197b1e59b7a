"""`pp`: pipeline parallelism, one device per stage, GPipe-style compute-balanced partition.

As in the paper's evaluation, the baseline gets heterogeneity-aware balancing (each stage's
layers are chosen so the slowest stage's compute is minimal on its own device) and runs with
Asteroid's 1F1B. Like GPipe, the partition ignores the size of activations at the cuts.
Stages respect memory budgets. Its strongest honest form tries every pipeline depth k on the
k fastest devices (placed in memory order, largest first, as the head holds most activations).
"""

from __future__ import annotations

import numpy as np

from hppctl.planner import progress
from hppctl.planner.cost import CostModel, StageChoice, asteroid_warmup
from hppctl.planner.forked import forked_map, worth_forking
from hppctl.planner.registry import Candidate, strategy
from hppctl.planner.strategies.dp import fastest_first
from hppctl.planner.vector_alloc import first_minima, tables_for


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
    if missing:
        progress.step(f"partitions of {len(missing)} pipeline depths")
    if len(missing) > 1 and worth_forking(cm.num_layers * (cm.num_layers + 1) // 2):
        found = forked_map(lambda: lambda devices: _min_max_partition(cm, list(devices)), missing)
    else:
        found = [_min_max_partition(cm, list(devices)) for devices in missing]
    cache.update(zip(missing, found))
    return [None if cache[tuple(d)] is None else list(cache[tuple(d)]) for d in device_lists]


def _min_max_partition(cm: CostModel, devices: list[int]) -> list[StageChoice] | None:
    """The min-max partition, first start i on ties at every end j (`_partition_over`).

    Solved first with cuts only every few layers: a partition of the fine layers too, so its value U
    bounds the answer. Then over the fine ranges that can lie on a partition of value <= U
    (`_Windows`): the same answer as over every range, in a band around each cut."""
    L, P = cm.num_layers, len(devices)
    if P > L or any(cm.ceiling[d] < cm.B for d in devices):  # the whole micro-batch past what d was measured at
        return None
    on_grid = _grid_pairs(L, _coarse_stride(L, P))
    coarse = _partition_over(cm, devices, lambda p: on_grid, np.inf)
    if coarse is None:  # no partition cut on the grid fits: every range
        every = _grid_pairs(L, 1)
        found = _partition_over(cm, devices, lambda p: every, np.inf)
    else:
        found = _partition_over(cm, devices, _Windows(cm, devices, coarse[1]).pairs, coarse[1])
    if found is None:
        return None
    cuts = found[0]
    return [StageChoice(cuts[p], cuts[p + 1], (d,), (cm.B,)) for p, d in enumerate(devices)]


def _coarse_stride(layers: int, stages: int) -> int:
    """Cut every k layers in the bounding pass: ~max(64, 4 stages) cut positions (a few thousand pairs)."""
    return max(1, layers // max(64, 4 * stages))


def _grid_pairs(layers: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every range whose ends are multiples of `stride` (or L), ordered by end, then start."""
    points = np.unique(np.r_[np.arange(0, layers, stride), layers])
    end, start = np.tril_indices(len(points) - 1, k=0)
    return points[start], points[end + 1]


def _range_times(cm: CostModel, d: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Forward + backward of layers [start, end) on device d at batch B (`LayerTables.times_at`)."""
    fwd, bwd = tables_for(cm).times_at(np.full(start.shape, d), start, end, float(cm.B))
    return fwd + bwd


def _partition_over(cm: CostModel, devices: list[int], stage_pairs, bound: float) -> tuple[list[int], float] | None:
    """The min-max partition using, for stage p, the ranges `stage_pairs(p)` (start, end arrays ordered by
    end, then start) whose time is at most `bound`: (cuts, value), or None if none covers the layers.
    Stage p ends at layer j: the best over its start i of max(best[i], cost[i, j]), first i on ties.

    With `bound` at least the value over every range, and `stage_pairs(p)` holding every range stage p
    can run in a partition of value <= bound, the answer is that over every range, ties and all: each
    best[j] on such a partition is reached by such a range (its cost, >= its time, <= bound), and so is
    the first start reaching it; a best[j] the ranges miss is above bound or on no such partition."""
    L, P, t = cm.num_layers, len(devices), tables_for(cm)
    best = np.full(L + 1, np.inf)
    best[0] = 0.0
    back = np.zeros((P, L + 1), dtype=np.int64)
    for p, d in enumerate(devices):
        start, end = stage_pairs(p)
        time = _range_times(cm, d, start, end)
        if np.isfinite(bound):
            keep = time <= bound
            start, end, time = start[keep], end[keep], time[keep]
        if start.size == 0:
            return None
        fits = _fits(cm, start, end, float(t.budget[d]), asteroid_warmup(P, p, cm.M))
        cand = np.maximum(best[start], np.where(fits, time, np.inf))
        pick = first_minima(cand, end)
        best = np.full(L + 1, np.inf)
        best[end[pick]] = cand[pick]
        back[p, end[pick]] = start[pick]
    if not np.isfinite(best[L]):
        return None
    cuts, j = [L], L
    for p in range(P - 1, -1, -1):
        j = int(back[p][j])
        cuts.append(j)
    cuts.reverse()
    return cuts, float(best[L])


class _Windows:
    """Per stage, the ranges that can lie on a partition of `devices` whose every stage runs within `bound`.

    A stage's time grows with its range, so the farthest layer k stages can reach, F_k, is reached by
    each taking as many layers as fit in bound from the last one's end, and the earliest layer stage k
    can start at and still let stages k.. cover the rest, E_k, by each (from the back) starting as early
    as fits. Stage k then starts in [E_k, F_k] and ends in [E_k+1, F_k+1] (each stage one layer at
    least). Memory is left out (the windows only grow); a 1e-9 margin covers rounding.
    """

    def __init__(self, cm: CostModel, devices: list[int], bound: float):
        L, P = cm.num_layers, len(devices)
        limit = bound * (1 + 1e-9)
        self.L, self.P = L, P
        self.reach = [0]  # F_k
        for k, d in enumerate(devices):
            f = self.reach[-1]
            ends = np.arange(f + 1, L + 1)
            within = np.flatnonzero(_range_times(cm, d, np.full(ends.shape, f), ends) <= limit)
            self.reach.append(int(ends[within[-1]]) if within.size else f)
        self.earliest = [L]  # E_k, from the back
        for d in reversed(devices):
            e = self.earliest[-1]
            starts = np.arange(e)
            within = np.flatnonzero(_range_times(cm, d, starts, np.full(starts.shape, e)) <= limit)
            self.earliest.append(int(starts[within[0]]) if within.size else e)
        self.earliest.reverse()

    def pairs(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Stage k's ranges, ordered by end, then start."""
        L, P = self.L, self.P
        lo, hi = max(k, self.earliest[k]), min(self.reach[k], L - (P - k))
        ends = np.arange(max(k + 1, self.earliest[k + 1], lo + 1), min(self.reach[k + 1], L - (P - k - 1)) + 1)
        counts = np.maximum(0, np.minimum(hi, ends - 1) - lo + 1)
        end = np.repeat(ends, counts)
        offsets = np.repeat(np.cumsum(counts) - counts, counts)
        return lo + np.arange(end.size) - offsets, end


def _fits(cm: CostModel, start: np.ndarray, end: np.ndarray, budget: float, warmup: int) -> np.ndarray:
    """Per range: B samples fit a device of `budget` bytes under `warmup` (`LayerTables.caps` >= B)."""
    t = tables_for(cm)
    spare = budget - cm.fixed_factor * (t.param[end] - t.param[start])
    received = np.where(start > 0, t.boundary[np.maximum(start - 1, 0)], 0.0)
    per = warmup * (t.act[end] - t.act[start] + received)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (spare >= 0) & ((per == 0) | (np.floor_divide(spare, np.where(per == 0, 1.0, per)) >= cm.B))


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
