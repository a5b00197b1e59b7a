"""A small sparse MILP builder over `scipy.optimize.milp` (HiGHS). Pure; scipy is imported lazily.

Variables are allocated in blocks (numpy index arrays) and constraints added as vectorised
rows, so time-indexed models with 10^5 binaries build in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hppctl.errors import RuntimeFailure


class SolverMissing(RuntimeFailure):
    """scipy (HiGHS) is needed for the admm and exact methods."""


@dataclass(frozen=True)
class Solution:
    x: np.ndarray | None
    objective: float | None
    status: str
    """"optimal", "time-limit" (x is the best found, maybe None), "infeasible", or another HiGHS message."""
    gap: float | None
    dual_bound: float | None
    seconds: float


class Model:
    def __init__(self) -> None:
        self._lb: list[np.ndarray] = []
        self._ub: list[np.ndarray] = []
        self._cost: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self.n = 0
        self._rows: list[np.ndarray] = []
        self._cols: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._lo: list[np.ndarray] = []
        self._hi: list[np.ndarray] = []
        self.m = 0

    def add_vars(self, count: int, *, lb: float = 0.0, ub: float = 1.0, integer: bool = True,
                 cost: float | np.ndarray = 0.0) -> np.ndarray:
        """`count` new variables; returns their indices."""
        idx = np.arange(self.n, self.n + count)
        self._lb.append(np.full(count, lb, dtype=float))
        self._ub.append(np.full(count, ub, dtype=float))
        self._cost.append(np.broadcast_to(np.asarray(cost, dtype=float), (count,)).copy())
        self._int.append(np.full(count, 1 if integer else 0, dtype=np.uint8))
        self.n += count
        return idx

    def add_rows(self, row: np.ndarray, col: np.ndarray, val: np.ndarray | float,
                 lo: np.ndarray | float, hi: np.ndarray | float, count: int) -> None:
        """`count` constraints lo <= A x <= hi; entry k of (row, col, val) is A[row_k, col_k] (rows 0-based here)."""
        row = np.asarray(row, dtype=np.int64)
        col = np.asarray(col, dtype=np.int64)
        self._rows.append(row + self.m)
        self._cols.append(col)
        self._vals.append(np.broadcast_to(np.asarray(val, dtype=float), row.shape).copy())
        self._lo.append(np.broadcast_to(np.asarray(lo, dtype=float), (count,)).copy())
        self._hi.append(np.broadcast_to(np.asarray(hi, dtype=float), (count,)).copy())
        self.m += count

    def solve(self, time_limit_s: float | None = None) -> Solution:
        try:
            from scipy.optimize import Bounds, LinearConstraint, milp
            from scipy.sparse import coo_array
        except ImportError:  # pragma: no cover - scipy is installed with the test extra
            raise SolverMissing("the admm and exact methods need scipy (HiGHS): pip install scipy") from None
        started = time.perf_counter()
        a = coo_array((np.concatenate(self._vals), (np.concatenate(self._rows), np.concatenate(self._cols))),
                      shape=(self.m, self.n)).tocsr()
        options = {"presolve": True}
        if time_limit_s is not None:
            options["time_limit"] = float(time_limit_s)
        res = milp(np.concatenate(self._cost), integrality=np.concatenate(self._int),
                   bounds=Bounds(np.concatenate(self._lb), np.concatenate(self._ub)),
                   constraints=LinearConstraint(a, np.concatenate(self._lo), np.concatenate(self._hi)),
                   options=options)
        status = {0: "optimal", 1: "time-limit", 2: "infeasible"}.get(res.status, res.message)
        return Solution(res.x, res.fun, status, getattr(res, "mip_gap", None), getattr(res, "mip_dual_bound", None),
                        time.perf_counter() - started)
