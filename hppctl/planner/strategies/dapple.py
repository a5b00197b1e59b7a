"""`dapple`: DAPPLE's planner (Fan et al., PPoPP'21), synchronous HPP for identical devices.

DAPPLE scores a candidate pipeline by its synchronous 1F1B latency,
  (M - 1) * max_s T_s + sum_s T_s + sum of transfers + max_s AllReduce_s,
with T_s the per-micro-batch forward+backward of stage s split evenly over its replicas.
We search the same space as its planner (contiguous stages, each replicated on some number
of devices) with a DP that keeps, per (layers, devices) prefix, the candidate with the best
score. Identical devices and no memory budgets are assumed; violations are reported.
"""

from __future__ import annotations

import numpy as np

from hppctl.planner.cost import CostModel
from hppctl.planner.registry import Candidate, strategy
from hppctl.planner.strategies.homogeneous import HomogeneousView, place_in_cluster_order


def pipeline_fill(m: int, peak: np.ndarray) -> np.ndarray:
    """(M - 1) * max_s T_s, the fill and drain of M micro-batches behind the slowest stage.

    With one micro-batch there is no fill: the term is 0 even where `peak` is inf (a prefix no
    stage reaches), where (M - 1) * peak would be 0 * inf = NaN, and NaN wins `np.argmin`.
    """
    return (m - 1) * peak if m > 1 else np.zeros_like(peak)


def dapple_partition(view: HomogeneousView, m: int) -> list[tuple[int, int, int]]:
    """Best-scored (start, end, replicas) stages over exactly N devices; DP over (layers, devices) prefixes."""
    L, N = view.L, view.N
    shape = (L + 1, N + 1)
    total, peak, comm, allr = (np.full(shape, np.inf) for _ in range(4))
    score = np.full(shape, np.inf)
    total[0, 0] = peak[0, 0] = comm[0, 0] = allr[0, 0] = score[0, 0] = 0.0
    back = np.full(shape + (2,), -1, dtype=np.int64)
    for j in range(1, L + 1):
        i = np.arange(j)
        link = np.where(i > 0, 2 * view.comm[np.maximum(i - 1, 0)], 0.0)
        for n in range(1, N + 1):
            for r in range(1, n + 1):
                t = view.compute(i, j) / r
                ar = 2 * (r - 1) * view.weights(i, j) / (r * view.bandwidth)
                cand_total, cand_peak = total[i, n - r] + t, np.maximum(peak[i, n - r], t)
                cand_comm, cand_allr = comm[i, n - r] + link, np.maximum(allr[i, n - r], ar)
                cand = pipeline_fill(m, cand_peak) + cand_total + cand_comm + cand_allr
                k = int(np.argmin(cand))
                if cand[k] < score[j, n]:
                    score[j, n], total[j, n], peak[j, n] = cand[k], cand_total[k], cand_peak[k]
                    comm[j, n], allr[j, n] = cand_comm[k], cand_allr[k]
                    back[j, n] = (k, r)
    stages, j, n = [], L, N
    while j > 0:
        i, r = (int(x) for x in back[j, n])
        stages.append((i, j, r))
        j, n = i, n - r
    return stages[::-1]


@strategy("dapple", "DAPPLE's planner: homogeneous devices, no memory budgets, synchronous 1F1B")
def plan_dapple(cm: CostModel) -> Candidate | None:
    view = HomogeneousView(cm)
    return Candidate(place_in_cluster_order(cm, dapple_partition(view, cm.M)), schedule="1f1b", memory_aware=False)
