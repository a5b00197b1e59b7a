"""The world as PipeDream and DAPPLE see it: identical devices, one bandwidth, no memory limits.

Their planners are given the mean device's per-layer times; the stages they choose are then
placed on the real devices in cluster order with an even split of samples, and scored by
the same cost model as every other strategy (so their memory violations show).
"""

from __future__ import annotations

import numpy as np

from hppctl.planner.cost import CostModel, StageChoice


class HomogeneousView:
    def __init__(self, cm: CostModel):
        L, n = cm.num_layers, len(cm.names)
        per_layer = np.zeros(L)
        for d in range(n):
            per_layer += [cm.forward_time(d, l, l + 1, cm.B) + cm.backward_time(d, l, l + 1, cm.B) for l in range(L)]
        self.time_prefix = np.concatenate([[0.0], np.cumsum(per_layer / n)])
        self.param_prefix = np.asarray(cm._param, dtype=np.float64)
        self.comm = np.asarray([cm.B * b / cm.profile.default_bytes_per_s for b in cm.boundary])
        self.bandwidth = cm.profile.default_bytes_per_s
        self.L, self.N = L, n

    def compute(self, i, j):
        return self.time_prefix[j] - self.time_prefix[i]

    def weights(self, i, j):
        return self.param_prefix[j] - self.param_prefix[i]


def place_in_cluster_order(cm: CostModel, stages: list[tuple[int, int, int]]) -> list[StageChoice]:
    """(start, end, replicas) -> stages on consecutive devices of the cluster file, even split."""
    out, next_device = [], 0
    for start, end, replicas in stages:
        devices = tuple(range(next_device, next_device + replicas))
        next_device += replicas
        base, extra = divmod(cm.B, replicas)
        out.append(StageChoice(start, end, devices, tuple(base + (k < extra) for k in range(replicas))))
    return out
