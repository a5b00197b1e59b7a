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
    return min((max(helper_optimum(q, i, list(clients)) for i, clients in enumerate(groups))
                for groups in feasible_assignments(q)), default=np.inf)


def feasible_assignments(q: Instance):
    """Every assignment of clients to helpers within the helpers' memory, as each helper's clients."""
    for assignment in itertools.product(range(q.num_helpers), repeat=q.num_clients):
        a = np.array(assignment)
        used = np.zeros(q.num_helpers, dtype=np.int64)
        np.add.at(used, a, q.demand)
        if not (used > q.capacity).any():
            yield [tuple(int(j) for j in np.flatnonzero(a == i)) for i in range(q.num_helpers)]


def _helper_best(q: Instance, i: int, clients: tuple) -> float:
    """min over every order of helper i's whole tasks (F before B per client), each task as early as
    possible. No pruning: each branch carries the helper's time, the F finishes and the worst
    completion so far, so a leaf costs O(1)."""
    r = {j: float(q.r[i, j]) for j in clients}
    p = {j: float(q.p[i, j]) for j in clients}
    gap = {j: float(q.l[i, j] + q.lp[i, j]) for j in clients}
    pp = {j: float(q.pp[i, j]) for j in clients}
    rp = {j: float(q.rp[i, j]) for j in clients}

    def best(now: float, f_end: dict, f_left: frozenset, b_left: frozenset, worst: float) -> float:
        if not f_left and not b_left:
            return worst
        result = np.inf
        for j in f_left:
            end = max(now, r[j]) + p[j]
            result = min(result, best(end, {**f_end, j: end}, f_left - {j}, b_left | {j}, worst))
        for j in b_left:
            end = max(now, f_end[j] + gap[j]) + pp[j]
            result = min(result, best(end, f_end, f_left, b_left - {j}, max(worst, end + rp[j])))
        return result

    return best(0.0, {}, frozenset(clients), frozenset(), 0.0)


def _run(q: Instance, i: int, order) -> float:
    """Makespan of helper i serving `order` whole, each task as early as its input and the helper allow."""
    now, f_end, worst = 0.0, {}, 0.0
    for kind, j in order:
        if kind == "F":
            now = f_end[j] = max(now, q.r[i, j]) + q.p[i, j]
        else:
            now = max(now, f_end[j] + q.l[i, j] + q.lp[i, j]) + q.pp[i, j]
            worst = max(worst, now + q.rp[i, j])
    return float(worst)


def nonpreemptive_optimum(q: Instance) -> float:
    """The best makespan the runtime can achieve (seconds, no preemption): every memory-feasible
    assignment x every order of each helper's whole tasks, each task started as early as possible."""
    @lru_cache(maxsize=None)
    def helper(i: int, clients: tuple) -> float:
        return _helper_best(q, i, clients)

    return min((max(helper(i, clients) for i, clients in enumerate(groups)) for groups in feasible_assignments(q)),
               default=np.inf)


def run_makespan(plan) -> float:
    """A plan's makespan as the runtime runs it: each helper serves its tasks whole, in the order
    their last piece appears in its sequence, with the plan's unrounded times."""
    q = Instance.from_times(plan.times)
    worst = 0.0
    for i, h in enumerate(plan.helper_plans):
        j = {c: k for k, c in enumerate(plan.clients)}
        last = {(pc.kind, j[pc.client]): k for k, pc in enumerate(h.sequence)}
        worst = max(worst, _run(q, i, sorted(last, key=last.__getitem__)))
    return worst
