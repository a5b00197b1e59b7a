"""The exact time-indexed integer program P (paper §IV, Eqs. 1-9), solved with HiGHS. Pure.

Variables on a quantized instance: y_ij (assignment), x_ijt / z_ijt (helper i runs j's forward /
backward in slot t), φ_j (backward finish), ξ (makespan). Two standard tightenings keep it small,
neither of which removes an optimal solution:

- the horizon is the makespan UB of a feasible heuristic plan (balanced-greedy's assignment with
  exact per-helper scheduling), not the paper's T: x_ijt exists only where the rest of the client's
  path still fits before UB, z_ijt only from its earliest possible start;
- the precedence (2), z_ij(t+l+l′) <= (1/p) Σ_{τ<t} x_ijτ, is written with a running sum
  C_ijt = Σ_{τ<=t} x_ijτ, so it costs O(T) instead of O(T²) nonzeros.

Meant for small instances (the paper's Table II: J <= 15, I <= 5); `time_limit_s` bounds the solve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hppctl.errors import Infeasible
from hppctl.planner.psl.backward import FREE, decomposed_timeline
from hppctl.planner.psl.fcfs import fcfs_timeline
from hppctl.planner.psl.greedy import balanced_assignment
from hppctl.planner.psl.instance import B, F, Instance, Timeline, check_slot_timeline, slot_pieces, task_code
from hppctl.planner.psl.lp import Model


@dataclass
class ExactResult:
    timeline: Timeline
    status: str
    """"optimal", "time-limit", or "heuristic" (the solver found nothing better than the bound's plan)."""
    gap: float | None
    lower_bound: float
    solve_s: float


def heuristic_bound(q: Instance, clients) -> Timeline | None:
    """The best of two cheap feasible plans (balanced-greedy with FCFS / with exact scheduling)."""
    try:
        assignment = balanced_assignment(q, clients)
    except Infeasible:
        return None
    return min((fcfs_timeline(q, assignment), decomposed_timeline(q, assignment)), key=lambda t: t.makespan)


def solve_exact(q: Instance, clients, *, time_limit_s: float | None = None) -> ExactResult:
    """Optimal slot timeline of P on the quantized instance `q` (or the best found in the time limit)."""
    start = heuristic_bound(q, clients)
    ub = int(round(start.makespan)) if start is not None else int(np.ceil(q.horizon()))
    lb = int(np.ceil(q.lower_bound()))
    if start is not None and ub <= lb:
        return ExactResult(start, "optimal", 0.0, float(lb), 0.0)
    model, v = _build(q, ub, lb)
    sol = model.solve(time_limit_s)
    if sol.status == "infeasible":
        raise Infeasible("exact: no assignment fits the helpers' memory (the integer program is infeasible)")
    if sol.x is None:
        if start is None:
            raise Infeasible(f"exact: no feasible plan found within {time_limit_s} s")
        return ExactResult(start, "heuristic", None, float(lb), sol.seconds)
    bound = sol.dual_bound if sol.dual_bound is not None else lb
    timeline = _timeline(q, sol.x, v, ub)
    check_slot_timeline(q, timeline)  # the solver's answer is replayed against P's rules, not trusted
    if start is not None and start.makespan < timeline.makespan:
        return ExactResult(start, "heuristic", None, float(bound), sol.seconds)
    return ExactResult(timeline, sol.status, sol.gap, float(bound), sol.seconds)


@dataclass
class _Vars:
    y: np.ndarray
    phi: np.ndarray
    xi: int
    x: dict[tuple[int, int], tuple[int, np.ndarray]]
    """(i, j) -> (first slot, variable indices of consecutive slots)."""
    z: dict[tuple[int, int], tuple[int, np.ndarray]]


def _domains(q: Instance, ub: int, i: int, j: int) -> tuple[range, range]:
    after_f = int(q.l[i, j] + q.lp[i, j] + q.pp[i, j] + q.rp[i, j])
    x_slots = range(int(q.r[i, j]), ub - after_f)
    z_slots = range(int(q.r[i, j] + q.p[i, j] + q.l[i, j] + q.lp[i, j]), ub - int(q.rp[i, j]))
    return x_slots, z_slots


def _build(q: Instance, ub: int, lb: int) -> tuple[Model, _Vars]:
    I, J = q.num_helpers, q.num_clients
    m = Model()
    y = m.add_vars(I * J).reshape(I, J)
    phi = m.add_vars(J, ub=float(ub), integer=False)
    xi = int(m.add_vars(1, lb=float(lb), ub=float(ub), integer=False, cost=1.0)[0])
    x: dict = {}
    z: dict = {}
    slot_rows: list[tuple[np.ndarray, np.ndarray]] = []  # (slot index i*ub+t, variable) for Eq. 3
    for i in range(I):
        for j in range(J):
            xs, zs = _domains(q, ub, i, j)
            if len(xs) < q.p[i, j] or len(zs) < q.pp[i, j]:
                m.add_rows(np.array([0]), np.array([y[i, j]]), 1.0, 0.0, 0.0, 1)  # this pair cannot meet UB
                continue
            xv = m.add_vars(len(xs))
            zv = m.add_vars(len(zs))
            x[(i, j)], z[(i, j)] = (xs.start, xv), (zs.start, zv)
            slot_rows += [(i * ub + np.arange(xs.start, xs.stop), xv), (i * ub + np.arange(zs.start, zs.stop), zv)]
            _pair_rows(m, q, i, j, y[i, j], phi[j], xs, xv, zs, zv)
    _slot_rows(m, slot_rows)
    _assignment_rows(m, q, y, phi, xi)
    _valid_inequalities(m, q, y, phi, xi, z)
    return m, _Vars(y, phi, xi, x, z)


def _pair_rows(m: Model, q: Instance, i: int, j: int, y: int, phi: int, xs: range, xv: np.ndarray,
               zs: range, zv: np.ndarray) -> None:
    p, pp = float(q.p[i, j]), float(q.pp[i, j])
    n = len(xv)
    # (6), (7): the assigned helper runs all of the forward and backward work.
    m.add_rows(np.zeros(n + 1), np.append(xv, y), np.append(np.ones(n), -p), 0.0, 0.0, 1)
    m.add_rows(np.zeros(len(zv) + 1), np.append(zv, y), np.append(np.ones(len(zv)), -pp), 0.0, 0.0, 1)
    # Running sum C_k = Σ_{k'<=k} x_k' (one continuous variable per forward slot).
    c = m.add_vars(n, ub=p, integer=False)
    rows = np.arange(n)
    m.add_rows(np.concatenate([rows, rows, rows[1:]]), np.concatenate([c, xv, c[:-1]]),
               np.concatenate([np.ones(n), -np.ones(n), -np.ones(n - 1)]), 0.0, 0.0, n)
    # (2): z at slot s needs the whole forward done by slot s - l - l' - 1.
    delay = int(q.l[i, j] + q.lp[i, j])
    cut = np.arange(zs.start, zs.stop) - delay - 1 - xs.start  # index of the last allowed forward slot
    need = cut < n - 1
    k = int(need.sum())
    if k:
        rows = np.arange(k)
        m.add_rows(np.concatenate([rows, rows]), np.concatenate([zv[need], c[cut[need]]]),
                   np.concatenate([np.full(k, p), -np.ones(k)]), -np.inf, 0.0, k)
    # (8): φ_j >= (t+1) z_ijt.
    rows = np.arange(len(zv))
    m.add_rows(np.concatenate([rows, rows]), np.concatenate([np.full(len(zv), phi), zv]),
               np.concatenate([np.ones(len(zv)), -(np.arange(zs.start, zs.stop) + 1.0)]), 0.0, np.inf, len(zv))


def _slot_rows(m: Model, slot_rows: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """(3): one task per helper per slot."""
    keys = np.concatenate([k for k, _ in slot_rows])
    cols = np.concatenate([v for _, v in slot_rows])
    uniq, row = np.unique(keys, return_inverse=True)
    m.add_rows(row, cols, 1.0, -np.inf, 1.0, len(uniq))


def _assignment_rows(m: Model, q: Instance, y: np.ndarray, phi: np.ndarray, xi: int) -> None:
    I, J = y.shape
    # (4): one helper per client.
    m.add_rows(np.tile(np.arange(J), I), y.reshape(-1), 1.0, 1.0, 1.0, J)
    # (5): helper memory, in GB for numerics.
    m.add_rows(np.repeat(np.arange(I), J), y.reshape(-1), np.tile(q.demand / 1e9, I), -np.inf, q.capacity / 1e9, I)
    # ξ >= c_j = φ_j + Σ_i r'_ij y_ij (Eq. 9).
    rows = np.arange(J)
    m.add_rows(np.concatenate([rows, rows, np.tile(rows, I)]),
               np.concatenate([np.full(J, xi), phi, y.reshape(-1)]),
               np.concatenate([np.ones(J), -np.ones(J), -q.rp.reshape(-1).astype(float)]), 0.0, np.inf, J)


def _valid_inequalities(m: Model, q: Instance, y: np.ndarray, phi: np.ndarray, xi: int, z: dict) -> None:
    """Cuts that tighten the LP relaxation without removing any integer solution.

    - a client cannot beat its path: φ_j >= Σ_i y_ij (r + p + l + l′ + p′)_ij;
    - a helper's work runs after its earliest release and before its smallest tail:
      ξ >= min_j r_ij + Σ_j (p + p′)_ij y_ij + min_j r′_ij.

    NOTE: a third valid cut, φ_j >= Σ_t (t+1) z_ijt / p′_ij + (p′_ij - 1)/2 (the last of p′ distinct
    slots lies (p′-1)/2 after their mean), made HiGHS's presolve return a wrong "optimal" 78 on an
    instance whose optimum is 77 (bench/psl.py, scenario 1, J=10, I=2, seed 712); it is left out.
    """
    I, J = y.shape
    rows = np.arange(J)
    before = (q.r + q.p + q.l + q.lp + q.pp).astype(float)
    m.add_rows(np.concatenate([rows, np.tile(rows, I)]), np.concatenate([phi, y.reshape(-1)]),
               np.concatenate([np.ones(J), -before.reshape(-1)]), 0.0, np.inf, J)
    rows = np.arange(I)
    m.add_rows(np.concatenate([rows, np.repeat(rows, J)]), np.concatenate([np.full(I, xi), y.reshape(-1)]),
               np.concatenate([np.ones(I), -(q.p + q.pp).reshape(-1).astype(float)]),
               (q.r.min(axis=1) + q.rp.min(axis=1)).astype(float), np.inf, I)


def _timeline(q: Instance, sol: np.ndarray, v: _Vars, ub: int) -> Timeline:
    assignment = np.argmax(np.round(sol[v.y]), axis=0)
    owners = [np.full(ub, FREE, dtype=np.int64) for _ in range(q.num_helpers)]
    J = q.num_clients
    f_done, b_done = np.zeros(J), np.zeros(J)
    for kind, table, done in ((F, v.x, f_done), (B, v.z, b_done)):
        for (i, j), (first, idx) in table.items():
            if assignment[j] != i:
                continue
            slots = first + np.flatnonzero(sol[idx] > 0.5)
            owners[i][slots] = task_code(kind, j)
            done[j] = slots.max() + 1
    pieces = []
    for i in range(q.num_helpers):
        mine = np.flatnonzero(assignment == i)
        work = {(F, int(j)): int(q.p[i, j]) for j in mine} | {(B, int(j)): int(q.pp[i, j]) for j in mine}
        pieces.append(slot_pieces(owners[i], work))
    return Timeline(assignment, pieces, f_done, b_done).finish(q)
