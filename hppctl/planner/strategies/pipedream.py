"""`pipedream`: PipeDream's partitioning DP (Narayanan et al., SOSP'19, §3.1), as published.

A(j, m) = min over i < j, 1 <= m' < m of max(A(i, m - m'), 2 C_i, T(i -> j, m')),
A(j, m) also = T(0 -> j, m) (one replicated stage), with
T(i -> j, m) = (1/m) max(sum compute, sum 4(m-1)|w| / (m bw)) and C_i = activation transfer.
It assumes identical devices and ignores memory budgets; violations are reported, not hidden.
Evaluated synchronously with 1F1B (PipeDream-Flush), as the Asteroid paper compared it.
"""

from __future__ import annotations

import numpy as np

from hppctl.planner.cost import CostModel
from hppctl.planner.registry import Candidate, strategy
from hppctl.planner.strategies.homogeneous import HomogeneousView, place_in_cluster_order


def pipedream_partition(view: HomogeneousView) -> list[tuple[int, int, int]]:
    L, N = view.L, view.N
    A = np.full((L + 1, N + 1), np.inf)
    back: dict[tuple[int, int], tuple[int, int]] = {}
    i_all = np.arange(L + 1)

    def stage_time(i, j, m):
        sync = 4 * (m - 1) * view.weights(i, j) / (m * view.bandwidth) if m > 1 else 0.0
        return np.maximum(view.compute(i, j), sync) / m

    for j in range(1, L + 1):
        for m in range(1, N + 1):
            A[j, m] = stage_time(0, j, m)
            back[(j, m)] = (0, m)
            for m_last in range(1, m):
                i = i_all[1:j]
                cand = np.maximum.reduce([A[i, m - m_last], 2 * view.comm[i - 1], stage_time(i, j, m_last)])
                if cand.size and cand.min() < A[j, m]:
                    k = int(cand.argmin())
                    A[j, m] = cand[k]
                    back[(j, m)] = (int(i[k]), m_last)
    stages, j, m = [], L, N
    while j > 0:
        i, m_last = back[(j, m)]
        stages.append((i, j, m_last))
        j, m = i, m - m_last
    return stages[::-1]


@strategy("pipedream", "PipeDream's planner: homogeneous devices, no memory budgets, 1F1B")
def plan_pipedream(cm: CostModel) -> Candidate | None:
    stages = pipedream_partition(HomogeneousView(cm))
    return Candidate(place_in_cluster_order(cm, stages), schedule="1f1b", memory_aware=False)
