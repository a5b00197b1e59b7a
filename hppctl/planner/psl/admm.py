"""The paper's decomposition (§V): ADMM for the forward problem P_f, then the exact backward schedule.

Algorithm 1 relaxes the coupling (6) Σ_t x_ijt = y_ij p_ij and alternates two integer programs
on a quantized instance:

    w-step  min_x  max_j c^f_j + ρ/2 Σ_ij |Σ_t x_ijt - y_ij p_ij + μ_ij|
            s.t. release (1), finish (12), completion (13) with y fixed, one F task per slot (14),
                 and the tightening (20) Σ_i Σ_t x_ijt / p_ij = 1 (each client fully served by some mix)
    y-step  min_y  max_j c^f_j + ρ/2 Σ_ij |Σ_t x_ijt - y_ij p_ij + μ_ij|   s.t. (4), (5)
    dual    μ_ij += Σ_t x_ijt - y_ij p_ij

in the scaled form of the released code (ρ = 350, at most 5 iterations, stop when y and the
forward makespan are stationary). The y-step keeps the l-term of (13) in its objective, since
c^f depends on y through it. The final step (19) re-solves the forward schedule for the final
assignment with (6) enforced; per helper that is 1|r_j,pmtn|max(C_j + l_j), solved exactly by
largest-tail-first (backward.py) instead of another integer program. The backward schedule
(Theorem 2) follows exactly. Subproblems share `time_limit_s`; the paper allows inexact ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hppctl.errors import Infeasible
from hppctl.planner.psl.backward import decomposed_timeline
from hppctl.planner.psl.instance import Instance, Timeline
from hppctl.planner.psl.lp import Model

RHO = 350.0
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
        work, phi_f, seconds, status = _w_step(q, y, mu, rho, horizon, budget)
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


def _w_step(q: Instance, y: np.ndarray, mu: np.ndarray, rho: float, horizon: int,
            time_limit_s: float | None) -> tuple[np.ndarray | None, np.ndarray | None, float, str]:
    """Schedule block: returns (Σ_t x_ijt, φ^f_j, seconds, status)."""
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
            xs[(i, j)] = xv
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
    work = np.zeros((I, J))
    for (i, j), xv in xs.items():
        work[i, j] = np.round(sol.x[xv]).sum()
    return work, sol.x[phi], sol.seconds, sol.status


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
