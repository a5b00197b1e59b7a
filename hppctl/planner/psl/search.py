"""`search`: the optimum of small instances as the runtime runs them, by branch and bound. Pure.

Every memory-feasible assignment, and per helper every order of its whole tasks (each client's F
before its B), each task as early as possible (`sequence.helper_run`: idling never helps a makespan
when the order is fixed), in unrounded seconds — the cost model `auto` ranks plans by. Prunes with
the best plan known so far (`incumbent`) and per-client lower bounds; a helper's answer for a set of
clients is reused across assignments.

The work is bounded by a count of search nodes, not by wall-clock time, so the same instance always
gives the same plan: when the budget runs out the search stops and says so (`complete` false),
returning the best plan it has (if any beats the incumbent).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from hppctl.planner.psl.instance import B, F, Instance, Timeline
from hppctl.planner.psl.sequence import Task, ordered_timeline

MAX_NODES = 300_000
"""Search nodes `auto` allows (about a second in Python). Enough to finish 5 clients on 2 helpers
with room to spare (the test instances take at most a few thousand); larger instances usually stop
early and keep the best of the other methods."""


@dataclass
class SearchResult:
    timeline: Timeline | None
    """The best plan found that beats the incumbent (None: nothing beats it)."""
    complete: bool
    """The whole space was searched: no plan is better than min(incumbent, this timeline)."""
    nodes: int


class _OutOfBudget(Exception):
    pass


def search(instance: Instance, incumbent: float = math.inf, max_nodes: int = MAX_NODES) -> SearchResult:
    """The best non-preemptive plan strictly below `incumbent` (see the module docstring)."""
    state = _Search(instance, incumbent, max_nodes)
    try:
        state.run()
        complete = True
    except _OutOfBudget:
        complete = False
    timeline = None
    if state.best is not None:
        assignment, orders = state.best
        timeline = ordered_timeline(instance, assignment, orders)
    return SearchResult(timeline, complete, state.nodes)


class _Search:
    def __init__(self, instance: Instance, incumbent: float, max_nodes: int) -> None:
        self.q = instance
        self.bound = incumbent
        self.max_nodes = max_nodes
        self.nodes = 0
        self.best: tuple[np.ndarray, list[list[Task]]] | None = None
        self.memo: dict[tuple[int, tuple[int, ...]], tuple[float, list[Task] | None]] = {}
        """(helper, clients) -> (its optimum, an optimal order), or (a value no order beats, None)."""

    def run(self) -> None:
        q = self.q
        for assignment in itertools.product(range(q.num_helpers), repeat=q.num_clients):
            a = np.array(assignment, dtype=np.int64)
            used = np.zeros(q.num_helpers, dtype=np.int64)
            np.add.at(used, a, q.demand)
            self.count()  # assignments count too: memory may rule out almost all of them
            if (used > q.capacity).any():
                continue
            orders, values = [], []
            for i in range(q.num_helpers):
                value, order = self.helper_best(i, tuple(int(j) for j in np.flatnonzero(a == i)))
                if order is None or value >= self.bound:
                    break
                orders.append(order)
                values.append(value)
            else:
                self.bound, self.best = max(values), (a, orders)

    def helper_best(self, i: int, clients: tuple[int, ...]) -> tuple[float, list[Task] | None]:
        """Helper i's best order for `clients` if it beats the current bound, else (bound, None)."""
        key = (i, clients)
        known = self.memo.get(key)
        if known is not None and (known[1] is not None or known[0] >= self.bound):
            return known  # an optimum, or "nothing below a bound at least as high as today's"
        result = _HelperSearch(self, i, clients).solve(self.bound)
        self.memo[key] = result
        return result

    def count(self) -> None:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise _OutOfBudget


class _HelperSearch:
    """Depth-first over helper i's task orders, pruned by lower bounds on the makespan."""

    def __init__(self, owner: _Search, i: int, clients: tuple[int, ...]) -> None:
        q = owner.q
        self.owner = owner
        self.r = {j: float(q.r[i, j]) for j in clients}
        self.p = {j: float(q.p[i, j]) for j in clients}
        self.gap = {j: float(q.l[i, j] + q.lp[i, j]) for j in clients}
        self.pp = {j: float(q.pp[i, j]) for j in clients}
        self.rp = {j: float(q.rp[i, j]) for j in clients}
        self.clients = clients
        self.best_value = math.inf
        self.best_order: list[Task] | None = None

    def solve(self, bound: float) -> tuple[float, list[Task] | None]:
        if not self.clients:
            return 0.0, []
        self.best_value = bound
        self.visit(0.0, {}, set(self.clients), set(), 0.0, [])
        if self.best_order is None:
            return bound, None
        return self.best_value, self.best_order

    def lower_bound(self, now: float, f_done: dict[int, float], f_left: set[int], b_left: set[int]) -> float:
        """No completion of this branch beats: any waiting client's own remaining path from now,
        nor all remaining work back to back followed by the smallest remaining tail."""
        bound, work = now, 0.0
        for j in f_left:
            bound = max(bound, max(now, self.r[j]) + self.p[j] + self.gap[j] + self.pp[j] + self.rp[j])
            work += self.p[j] + self.pp[j]
        for j in b_left - f_left:
            bound = max(bound, max(now, f_done[j] + self.gap[j]) + self.pp[j] + self.rp[j])
            work += self.pp[j]
        if b_left:
            bound = max(bound, now + work + min(self.rp[j] for j in b_left))
        return bound

    def visit(self, now: float, f_done: dict[int, float], f_left: set[int], b_left: set[int],
              done: float, order: list[Task]) -> None:
        self.owner.count()
        if not f_left and not b_left:
            if done < self.best_value:
                self.best_value, self.best_order = done, list(order)
            return
        if max(done, self.lower_bound(now, f_done, f_left, b_left | f_left)) >= self.best_value:
            return
        for j in sorted(f_left):
            end = max(now, self.r[j]) + self.p[j]
            f_done[j] = end
            order.append((F, j))
            self.visit(end, f_done, f_left - {j}, b_left | {j}, done, order)
            order.pop()
            del f_done[j]
        for j in sorted(b_left):
            end = max(now, f_done[j] + self.gap[j]) + self.pp[j]
            order.append((B, j))
            self.visit(end, f_done, f_left, b_left - {j}, max(done, end + self.rp[j]), order)
            order.pop()
