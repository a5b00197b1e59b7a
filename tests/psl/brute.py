"""Brute force references for tiny instances (slots): the per-helper optimum and the optimum of P."""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from hppctl.planner.psl.instance import Instance


def helper_optimum(q: Instance, i: int, clients: list[int]) -> float:
    """min over preemptive slot schedules of one helper of max_j (B finish + r′), by exhaustive search.

    Idling while a task is available is never needed (running work earlier delays nothing), so the
    search branches only over which available task takes the slot."""
    if not clients:
        return 0.0
    r = tuple(int(q.r[i, j]) for j in clients)
    p = tuple(int(q.p[i, j]) for j in clients)
    gap = tuple(int(q.l[i, j] + q.lp[i, j]) for j in clients)
    pp = tuple(int(q.pp[i, j]) for j in clients)
    rp = tuple(int(q.rp[i, j]) for j in clients)

    @lru_cache(maxsize=None)
    def best(t: int, f_left: tuple, b_left: tuple, b_release: tuple) -> float:
        if all(b == 0 for b in b_left):
            return -np.inf
        options = [("F", k) for k in range(len(r)) if f_left[k] > 0 and r[k] <= t]
        options += [("B", k) for k in range(len(r)) if b_left[k] > 0 and b_release[k] is not None and b_release[k] <= t]
        if not options:
            upcoming = [r[k] for k in range(len(r)) if f_left[k] > 0] + \
                       [b_release[k] for k in range(len(r)) if b_left[k] > 0 and b_release[k] is not None]
            return best(min(upcoming), f_left, b_left, b_release)
        result = np.inf
        for kind, k in options:
            fl, bl, br, cost = list(f_left), list(b_left), list(b_release), -np.inf
            if kind == "F":
                fl[k] -= 1
                if fl[k] == 0:
                    br[k] = t + 1 + gap[k]
            else:
                bl[k] -= 1
                if bl[k] == 0:
                    cost = t + 1 + rp[k]
            result = min(result, max(cost, best(t + 1, tuple(fl), tuple(bl), tuple(br))))
        return result

    return best(0, p, pp, tuple([None] * len(r)))


def optimum(q: Instance) -> float:
    """Optimum of P: every memory-feasible assignment, each helper solved exhaustively."""
    best = np.inf
    for assignment in itertools.product(range(q.num_helpers), repeat=q.num_clients):
        a = np.array(assignment)
        used = np.zeros(q.num_helpers, dtype=np.int64)
        np.add.at(used, a, q.demand)
        if (used > q.capacity).any():
            continue
        value = max(helper_optimum(q, i, [int(j) for j in np.flatnonzero(a == i)]) for i in range(q.num_helpers))
        best = min(best, value)
    return best
