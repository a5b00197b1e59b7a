"""The paper's decomposition (§V): ADMM for the forward problem P_f, then the exact backward schedule.

Algorithm 1 relaxes the coupling (6) Σ_t x_ijt = y_ij p_ij and alternates two integer programs
on a quantized instance:

    w-step  min_x  max_j c^f_j + ρ/2 Σ_ij |Σ_t x_ijt - y_ij p_ij + μ_ij|
            s.t. release (1), finish (12), completion (13) with y fixed, one F task per slot (14),
                 and the tightening (20) Σ_i Σ_t x_ijt / p_ij = 1 (each client fully served by some mix)
    y-step  min_y  max_j c^f_j + ρ/2 Σ_ij |Σ_t x_ijt - y_ij p_ij + μ_ij|   s.t. (4), (5)
    dual    μ_ij += Σ_t x_ijt - y_ij p_ij

in the scaled form of the released code (at most 5 iterations, stop when y and the forward
makespan are stationary). ρ: the code's 350 is in its own slot units; on a slot grid with
T_f ≈ 100 it makes one slot of penalty worth 175 slots of makespan, so the first w-step puts
every client on its fastest helper and the assignment never moves (measured, bench/psl.py:
7 of 32 Table II-style instances above the paper's worst gap of 14.9 %). hppctl uses ρ = 2,
one slot of penalty per slot of makespan (1 of 32 above 14.9 %; mean gap 4.3 % against 9.0 %). The y-step keeps the l-term of (13) in its objective, since
c^f depends on y through it. The final step (19) re-solves the forward schedule for the final
assignment with (6) enforced; per helper that is 1|r_j,pmtn|max(C_j + l_j), solved exactly by
largest-tail-first (backward.py) instead of another integer program. The backward schedule
(Theorem 2) follows exactly. Subproblems share `time_limit_s`; the paper allows inexact ones.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from hppctl.errors import Infeasible
from hppctl.planner.psl.backward import FREE, decomposed_timeline, largest_tail_first
from hppctl.planner.psl.instance import Instance, Timeline
from hppctl.planner.psl.lp import Model

RHO = 2.0
"""ADMM penalty in slots (the released code: 350; see the module docstring)."""
CODE_RHO = 350.0
MAX_ITERATIONS = 5


@dataclass
class AdmmResult:
    timeline: Timeline
    iterations: int
    converged: bool
    solve_s: float
    notes: list[str] = field(default_factory=list)


def solve_admm(q: Instance, *, rho: float = RHO, max_iterations: int = MAX_ITERATIONS,
               time_limit_s: float | None = None) -> AdmmResult:
    """Algorithm 1 + Eq. (19) + Algorithm 2 on the quantized instance `q`."""
    I, J = q.num_helpers, q.num_clients
    horizon = int(np.ceil(q.forward_horizon()))
    y = np.zeros((I, J))
    mu = np.zeros((I, J))
    previous = None
    solve_s, notes = 0.0, []
    converged, iterations = False, 0
    for iterations in range(1, max_iterations + 1):
        budget = None if time_limit_s is None else max(0.5, (time_limit_s - solve_s) / 2)
        work, phi_f, seconds, status = w_step(q, y, mu, rho, horizon, budget)
        solve_s += seconds
        if work is None:
            notes.append(f"admm: w-step {iterations} found no schedule ({status}); kept the previous assignment")
            break
        y_new, makespan, seconds, status = _y_step(q, work, phi_f, mu, rho, budget)
        solve_s += seconds
        if y_new is None:
            raise Infeasible("admm: no assignment fits the helpers' memory (the y-step integer program is infeasible)")
        mu += work - y_new * q.p
        stationary = np.abs(y_new - y).sum() < 1 and previous is not None and abs(makespan - previous) < 1
        y, previous = y_new, makespan
        if stationary:
            converged = True
            break
    if not y.any():
        raise Infeasible("admm: no assignment within the time limit")
    assignment = np.argmax(y, axis=0)
    return AdmmResult(decomposed_timeline(q, assignment), iterations, converged, solve_s, notes)


def w_step_time_indexed(q: Instance, y: np.ndarray, mu: np.ndarray, rho: float, horizon: int,
                        time_limit_s: float | None = None) -> tuple[np.ndarray | None, np.ndarray | None, float, str]:
    """The w-step exactly as the paper writes it (x_ijt per slot); the reference `w_step` is tested against.

    Returns (Σ_t x_ijt, φ^f_j, seconds, status); the objective is ξ + ρ/2 Σ e_ij."""
    I, J = q.num_helpers, q.num_clients
    m = Model()
    phi = m.add_vars(J, ub=float(horizon), integer=False)
    xi = int(m.add_vars(1, ub=np.inf, integer=False, cost=1.0)[0])
    e = m.add_vars(I * J, ub=np.inf, integer=False, cost=rho / 2).reshape(I, J)
    slots, xs = [], {}
    fraction_rows, fraction_cols, fraction_vals = [], [], []
    for i in range(I):
        for j in range(J):
            ts = np.arange(int(q.r[i, j]), horizon)
            if len(ts) == 0:
                continue
            xv = m.add_vars(len(ts))
            xs[(i, j)] = (ts, xv)
            slots.append((i * horizon + ts, xv))
            rows = np.arange(len(ts))  # (12): φ^f_j >= (t+1) x_ijt
            m.add_rows(np.concatenate([rows, rows]), np.concatenate([np.full(len(ts), phi[j]), xv]),
                       np.concatenate([np.ones(len(ts)), -(ts + 1.0)]), 0.0, np.inf, len(ts))
            n = len(xv)  # |Σ_t x - y p + μ| <= e
            m.add_rows(np.zeros(n + 1), np.append(xv, e[i, j]), np.append(np.ones(n), -1.0),
                       -np.inf, q.p[i, j] * y[i, j] - mu[i, j], 1)
            m.add_rows(np.zeros(n + 1), np.append(xv, e[i, j]), np.append(np.ones(n), 1.0),
                       q.p[i, j] * y[i, j] - mu[i, j], np.inf, 1)
            fraction_rows.append(np.full(n, j))
            fraction_cols.append(xv)
            fraction_vals.append(np.full(n, 1.0 / q.p[i, j]))
    keys = np.concatenate([k for k, _ in slots])
    uniq, row = np.unique(keys, return_inverse=True)
    m.add_rows(row, np.concatenate([v for _, v in slots]), 1.0, -np.inf, 1.0, len(uniq))  # (14)
    m.add_rows(np.concatenate(fraction_rows), np.concatenate(fraction_cols), np.concatenate(fraction_vals),
               1.0, 1.0, J)  # (20)
    tail = (q.l * y).sum(axis=0)  # (13) with y fixed: ξ >= φ^f_j + Σ_i l_ij y_ij
    rows = np.arange(J)
    m.add_rows(np.concatenate([rows, rows]), np.concatenate([np.full(J, xi), phi]),
               np.concatenate([np.ones(J), -np.ones(J)]), tail, np.inf, J)
    sol = m.solve(time_limit_s)
    if sol.x is None:
        return None, None, sol.seconds, sol.status
    work, finish = np.zeros((I, J)), np.zeros(J)
    for (i, j), (ts, xv) in xs.items():
        on = np.round(sol.x[xv]) > 0
        work[i, j] = on.sum()
        if on.any():  # φ^f_j from x itself: the solver only pins the largest φ^f
            finish[j] = max(finish[j], ts[on].max() + 1.0)
    return work, finish, sol.seconds, sol.status


def _y_step(q: Instance, work: np.ndarray, phi_f: np.ndarray, mu: np.ndarray, rho: float,
            time_limit_s: float | None) -> tuple[np.ndarray | None, float, float, str]:
    """Assignment block: returns (y, max_j c^f_j, seconds, status)."""
    I, J = q.num_helpers, q.num_clients
    m = Model()
    y = m.add_vars(I * J).reshape(I, J)
    e = m.add_vars(I * J, ub=np.inf, integer=False, cost=rho / 2).reshape(I, J)
    xi = int(m.add_vars(1, ub=np.inf, integer=False, cost=1.0)[0])
    n = I * J
    rows = np.arange(n)
    target = (work + mu).reshape(-1)  # |target - p y| <= e
    m.add_rows(np.concatenate([rows, rows]), np.concatenate([e.reshape(-1), y.reshape(-1)]),
               np.concatenate([np.ones(n), q.p.reshape(-1).astype(float)]), target, np.inf, n)
    m.add_rows(np.concatenate([rows, rows]), np.concatenate([e.reshape(-1), y.reshape(-1)]),
               np.concatenate([np.ones(n), -q.p.reshape(-1).astype(float)]), -target, np.inf, n)
    m.add_rows(np.tile(np.arange(J), I), y.reshape(-1), 1.0, 1.0, 1.0, J)  # (4)
    m.add_rows(np.repeat(np.arange(I), J), y.reshape(-1), np.tile(q.demand / 1e9, I), -np.inf,
               q.capacity / 1e9, I)  # (5)
    cols = np.arange(J)  # ξ >= φ^f_j + Σ_i l_ij y_ij
    m.add_rows(np.concatenate([cols, np.tile(cols, I)]), np.concatenate([np.full(J, xi), y.reshape(-1)]),
               np.concatenate([np.ones(J), -q.l.reshape(-1).astype(float)]), phi_f, np.inf, J)
    sol = m.solve(time_limit_s)
    if sol.x is None:
        return None, 0.0, sol.seconds, sol.status
    values = np.round(sol.x[y])
    return values, float(sol.x[xi]), sol.seconds, sol.status


# ---------------------------------------------------------------------------------------------
# The w-step without time indices
# ---------------------------------------------------------------------------------------------


def w_step(q: Instance, y: np.ndarray, mu: np.ndarray, rho: float, horizon: int,
           time_limit_s: float | None = None) -> tuple[np.ndarray | None, np.ndarray | None, float, str]:
    """The same subproblem as `w_step_time_indexed`, solved exactly and much faster.

    For a makespan target D every client gets the deadline d_j = min(T_f, D - Σ_i l_ij y_ij) on every
    helper, and a helper can run amounts X_ij of work in windows [r_ij, d_j) preemptively iff Horn's
    interval condition holds: for every release a and deadline b, the work released at or after a
    and due by b is at most b - a. So with X_ij integer (no slot variables)

        P(D) = min ρ/2 Σ_ij |X_ij - y_ij p_ij + μ_ij|   s.t. (20), Horn's condition on every helper

    and the w-step optimum is min_D D + P(D). P is a non-increasing step function of D; its steps
    are found by bisection with pruning, a few small integer programs in all. The schedule for the
    chosen D is earliest-deadline-first on every helper, which meets every deadline.
    """
    started = time.perf_counter()
    tails = (q.l * y).sum(axis=0)
    lo = int(np.min(q.r + 1, axis=0).max() + tails.min())
    hi = int(horizon + tails.max())
    memo: dict[int, tuple[float, np.ndarray | None]] = {}

    def penalty(D: int) -> float:
        if D not in memo:
            memo[D] = _penalty(q, y, mu, rho, _deadlines(D, tails, horizon))
        return memo[D][0]

    if not np.isfinite(penalty(hi)):
        return None, None, time.perf_counter() - started, "infeasible"
    best = _search(penalty, lo, hi)
    work = memo[best][1]
    finish = _edf_finish(q, work, _deadlines(best, tails, horizon))
    return work, finish, time.perf_counter() - started, "optimal"


def _deadlines(D: int, tails: np.ndarray, horizon: int) -> np.ndarray:
    return np.minimum(horizon, D - tails).astype(np.int64)


def _search(penalty, lo: int, hi: int) -> int:
    """argmin_D D + penalty(D) over [lo, hi] for a non-increasing step function `penalty` (smallest D on ties)."""
    best_d, best_v = hi, hi + penalty(hi)

    def visit(a: int, b: int) -> None:
        nonlocal best_d, best_v
        pa, pb = penalty(a), penalty(b)
        if a + pb >= best_v:  # nothing in [a, b] can beat the best: D >= a and P >= P(b)
            return
        if pa == pb or b - a <= 1:
            for d, v in ((a, a + pa), (b, b + pb)):
                if v < best_v or (v == best_v and d < best_d):
                    best_d, best_v = d, v
            return
        mid = (a + b) // 2
        visit(a, mid)
        visit(mid, b)

    visit(lo, hi)
    return best_d


def _penalty(q: Instance, y: np.ndarray, mu: np.ndarray, rho: float, deadline: np.ndarray) -> tuple[float, np.ndarray | None]:
    I, J = q.num_helpers, q.num_clients
    window = np.maximum(0, deadline[None, :] - q.r)
    if (window == 0).all(axis=0).any():
        return np.inf, None
    m = Model()
    X = m.add_vars(I * J, ub=np.inf).reshape(I, J)
    e = m.add_vars(I * J, ub=np.inf, integer=False, cost=rho / 2).reshape(I, J)
    flat = np.arange(I * J)
    m.add_rows(flat, X.reshape(-1), 1.0, 0.0, window.reshape(-1).astype(float), I * J)
    target = (q.p * y - mu).reshape(-1)  # |X - (y p - μ)| <= e
    for sign in (1.0, -1.0):
        m.add_rows(np.concatenate([flat, flat]), np.concatenate([e.reshape(-1), X.reshape(-1)]),
                   np.concatenate([np.ones(I * J), np.full(I * J, -sign)]), -sign * target, np.inf, I * J)
    scale = _row_scale(q.p)  # (20), multiplied by the lcm of the client's p_ij (integer coefficients)
    m.add_rows(np.tile(np.arange(J), I), X.reshape(-1), (scale[None, :] / q.p).reshape(-1), scale, scale, J)
    for i in range(I):
        _horn_rows(m, q.r[i], deadline, X[i])
    sol = m.solve()
    if sol.x is None:
        return np.inf, None
    return float(sol.objective), np.round(sol.x[X])


def _row_scale(p: np.ndarray) -> np.ndarray:
    """Per client, lcm_i p_ij when it is small enough to keep the coefficients exact, else 1."""
    scale = np.ones(p.shape[1])
    for j in range(p.shape[1]):
        lcm = math.lcm(*(int(v) for v in p[:, j]))
        if lcm <= 10**6:
            scale[j] = lcm
    return scale


def _horn_rows(m: Model, release: np.ndarray, deadline: np.ndarray, X: np.ndarray) -> None:
    """Σ_{j: a <= r_j, d_j <= b} X_j <= b - a for every release a and deadline b > a on one helper."""
    rows, cols, hi = [], [], []
    for a in np.unique(release):
        for b in np.unique(deadline):
            if b <= a:
                continue
            members = np.flatnonzero((release >= a) & (deadline <= b))
            if len(members) > 1:  # single clients are covered by their window bound
                rows.append(np.full(len(members), len(hi)))
                cols.append(X[members])
                hi.append(float(b - a))
    if hi:
        m.add_rows(np.concatenate(rows), np.concatenate(cols), 1.0, -np.inf, np.array(hi), len(hi))


def _edf_finish(q: Instance, work: np.ndarray, deadline: np.ndarray) -> np.ndarray:
    """φ^f_j: last slot of j's forward work over all helpers, each helper earliest-deadline-first."""
    finish = np.zeros(q.num_clients)
    for i in range(q.num_helpers):
        jobs = [int(j) for j in np.flatnonzero(work[i] > 0)]
        if not jobs:
            continue
        owner = np.full(int(deadline.max()) + 1, FREE, dtype=np.int64)
        _, done = largest_tail_first(owner, jobs, [int(q.r[i, j]) for j in jobs], [int(work[i, j]) for j in jobs],
                                     [-float(deadline[j]) for j in jobs], jobs)
        for j, t in done.items():
            finish[j] = max(finish[j], t)
    return finish
