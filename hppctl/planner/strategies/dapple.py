"""`dapple`: DAPPLE's planner (Fan et al., PPoPP'21), synchronous HPP for identical devices.

DAPPLE scores a candidate pipeline by its synchronous 1F1B latency,
  (M - 1) * max_s T_s + sum_s T_s + sum of transfers + max_s AllReduce_s,
with T_s the per-micro-batch forward+backward of stage s split evenly over its replicas.
We search the same space as its planner (contiguous stages, each replicated on some number
of devices) with a DP that keeps, per (layers, devices) prefix, the candidate with the best
score. Identical devices and no memory budgets are assumed; violations are reported.
"""

from __future__ import annotations

from hppctl.planner.cost import CostModel
from hppctl.planner.registry import Candidate, strategy
from hppctl.planner.strategies.homogeneous import HomogeneousView, place_in_cluster_order


def dapple_partition(view: HomogeneousView, m: int) -> list[tuple[int, int, int]]:
    L, N = view.L, view.N
    # state (j, n): (score, sum, max, comm, allreduce, stages)
    best: dict[tuple[int, int], tuple] = {(0, 0): (0.0, 0.0, 0.0, 0.0, 0.0, ())}

    def score(total, peak, comm, ar):
        return (m - 1) * peak + total + comm + ar

    for j in range(1, L + 1):
        for n in range(1, N + 1):
            pick = None
            for i in range(j):
                for r in range(1, n + 1):
                    prev = best.get((i, n - r))
                    if prev is None:
                        continue
                    t = view.compute(i, j) / r
                    ar = 2 * (r - 1) * view.weights(i, j) / (r * view.bandwidth)
                    comm = prev[3] + (2 * view.comm[i - 1] if i > 0 else 0.0)
                    total, peak, allr = prev[1] + t, max(prev[2], t), max(prev[4], ar)
                    s = score(total, peak, comm, allr)
                    if pick is None or s < pick[0]:
                        pick = (s, total, peak, comm, allr, prev[5] + ((i, j, r),))
            if pick is not None:
                best[(j, n)] = pick
    return list(best[(L, N)][5])


@strategy("dapple", "DAPPLE's planner: homogeneous devices, no memory budgets, synchronous 1F1B")
def plan_dapple(cm: CostModel) -> Candidate | None:
    view = HomogeneousView(cm)
    if view.L * view.L * view.N * view.N > 4_000_000:
        # NOTE: the O(L^2 N^2) search is pure Python; on huge inputs coarsen by block first.
        return None
    return Candidate(place_in_cluster_order(cm, dapple_partition(view, cm.M)), schedule="1f1b", memory_aware=False)
