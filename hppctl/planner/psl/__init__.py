"""PURE: parallel split learning planner — assign clients to helpers and order each helper's tasks.

    times = pair_times(profile, request)           # the paper's r, p, l, l′, p′, r′ + memory
    plan = plan_psl(profile, request, "auto")      # -> PslPlan (assignment, per-helper order, makespan)

Methods (docs/psl.md): `balanced-greedy` and `random-fcfs` (non-preemptive FCFS, in seconds),
`admm` (the paper's decomposition) and `exact` (the integer program P, HiGHS) on a slot grid,
and `auto`, the paper's strategy: the decomposition for up to 50 clients, balanced-greedy beyond,
and the better of the two when both run. Imports numpy; scipy only when admm/exact solve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from hppctl.errors import BadInput
from hppctl.limits import MAX_PSL_SLOTS
from hppctl.models.profile import Profile
from hppctl.models.psl import METHODS, PslPlan, PslRequest, PslTimes
from hppctl.planner.psl.build import to_plan
from hppctl.planner.psl.fcfs import fcfs_timeline
from hppctl.planner.psl.admm import RHO
from hppctl.planner.psl.instance import Instance, auto_slot
from hppctl.planner.psl.memory import check_memory
from hppctl.planner.psl.times import pair_times

__all__ = ["AUTO_ADMM_MAX_CLIENTS", "DEFAULT_TARGET_SLOTS", "METHODS", "pair_times", "plan_psl", "plan_times"]

AUTO_ADMM_MAX_CLIENTS = 50
"""auto runs the decomposition up to this many clients (paper §VII: ADMM for medium sizes, up to
50 clients; balanced-greedy for 100 and more, where the solver's overhead is not worth it)."""
DEFAULT_TARGET_SLOTS = 100
"""With `slot_s=None` the slot is sized so the forward horizon T_f is about this many slots."""
DEFAULT_TIME_LIMIT_S = 60.0


def plan_psl(profile: Profile, request: PslRequest, method: str = "auto", **options) -> PslPlan:
    """Plan `request` on `profile` (see `plan_times` for the options)."""
    return plan_times(pair_times(profile, request), request, method, model=profile.model,
                      granularity=profile.granularity, **options)


def plan_times(times: PslTimes, request: PslRequest, method: str = "auto", *, model: str = "?",
               granularity: str = "block", slot_s: float | None = None,
               target_slots: int = DEFAULT_TARGET_SLOTS, seed: int = 0,
               time_limit_s: float = DEFAULT_TIME_LIMIT_S, rho: float = RHO,
               evaluate: Callable[[PslPlan], float] | None = None) -> PslPlan:
    """Solve an instance with one method.

    `slot_s` fixes the slot of admm/exact (default: sized from `target_slots`); `seed` drives
    random-fcfs; `time_limit_s` bounds each solver; `rho` is admm's penalty; `evaluate` (e.g. the
    simulator's makespan) is how `auto` compares its candidates — without it they are compared on
    the slot grid.
    """
    if method not in METHODS:
        raise BadInput(f"--method: unknown method {method!r} (use one of: {', '.join(METHODS)})")
    if slot_s is not None and slot_s <= 0:
        raise BadInput(f"--slot: must be positive (got {slot_s})")
    if rho <= 0:
        raise BadInput(f"--rho: must be positive (got {rho})")
    instance = Instance.from_times(times)
    check_memory(instance, request.clients, request.helpers)
    common = dict(request=request, times=times, model=model, granularity=granularity, requested=method)
    slot = slot_s or auto_slot(instance, target_slots)
    options = _Options(seed, time_limit_s, rho)
    if method == "auto":
        return _auto(instance, slot, common, options, evaluate)
    return _solve(method, instance, slot, common, options)


@dataclass(frozen=True)
class _Options:
    seed: int
    time_limit_s: float
    rho: float


def _solve(method: str, instance: Instance, slot: float, common: dict, options: _Options) -> PslPlan:
    started = time.perf_counter()
    seed = options.seed
    notes: list[str] = []
    if method == "balanced-greedy":
        from hppctl.planner.psl.greedy import balanced_greedy
        timeline, solved, used_slot = balanced_greedy(instance, common["request"].clients), instance, None
    elif method == "random-fcfs":
        from hppctl.planner.psl.random_fcfs import random_fcfs
        timeline, solved, used_slot = random_fcfs(instance, common["request"].clients, seed), instance, None
        notes.append(f"random assignment seed {seed}")
    else:
        solved, used_slot = _slot_grid(instance, slot), slot
        timeline = _slot_method(method, solved, common["request"].clients, options, notes)
    return to_plan(timeline, method=method, instance=solved, slot_s=used_slot,
                   solver_time_s=time.perf_counter() - started, notes=notes, **common)


def _slot_grid(instance: Instance, slot: float) -> Instance:
    """The instance in whole slots, refused (exit 2) when its forward horizon T_f spans more than
    MAX_PSL_SLOTS: the time-indexed solvers have a variable per (helper, client, slot), and
    `slot: 1e-12` ran past a minute (docs/formats.md, Limits). Checked in floating point first,
    where a tiny slot cannot overflow the integer grid, then on the grid (every helper task takes
    at least one slot, so thousands of clients make thousands of slots whatever the slot)."""
    estimate = instance.forward_horizon() / slot
    solved = instance.quantize(slot) if estimate <= MAX_PSL_SLOTS else None
    slots = estimate if solved is None else solved.forward_horizon()
    if slots > MAX_PSL_SLOTS:
        raise BadInput(f"slot: {slot:g} s makes a forward horizon of {slots:.3g} slots, more than the limit of "
                       f"{MAX_PSL_SLOTS} (docs/formats.md, Limits): give a longer slot, or fewer --target-slots")
    return solved


def _slot_method(method: str, q: Instance, clients, options: _Options, notes: list[str]):
    time_limit_s = options.time_limit_s
    if method == "admm":
        from hppctl.planner.psl.admm import solve_admm
        result = solve_admm(q, rho=options.rho, time_limit_s=time_limit_s)
        notes += result.notes + [f"admm: rho {options.rho:g}, {result.iterations} iteration(s), "
                                 f"{'converged' if result.converged else 'stopped at the iteration limit'}"]
        return result.timeline
    from hppctl.planner.psl.milp import solve_exact
    result = solve_exact(q, clients, time_limit_s=time_limit_s)
    gap = "" if result.gap is None else f", gap {result.gap:.1%}"
    notes.append(f"exact: {result.status}{gap}, lower bound {result.lower_bound:g} slots, HiGHS {result.solve_s:.2f} s")
    return result.timeline


def _auto(instance: Instance, slot: float, common: dict, options: _Options,
          evaluate: Callable[[PslPlan], float] | None) -> PslPlan:
    greedy = _solve("balanced-greedy", instance, slot, common, options)
    if instance.num_clients > AUTO_ADMM_MAX_CLIENTS:
        return greedy.model_copy(update={"notes": greedy.notes + [
            f"auto: {instance.num_clients} clients > {AUTO_ADMM_MAX_CLIENTS}: balanced-greedy (paper §VII)"]})
    admm = _solve("admm", instance, slot, common, options)
    if evaluate is not None:
        scores, how = (evaluate(greedy), evaluate(admm)), "simulated"
    else:  # the same yardstick for both: FCFS on the slot grid admm solved on
        q = instance.quantize(slot)
        greedy_slots = fcfs_timeline(q, _indices(greedy)).makespan
        scores, how = (greedy_slots * slot, admm.prediction.makespan_s), "on the slot grid"
    best = admm if scores[1] <= scores[0] else greedy
    note = (f"auto: admm {scores[1]:.3f} s vs balanced-greedy {scores[0]:.3f} s ({how}); "
            f"kept {best.method}; total solver time {greedy.solver_time_s + admm.solver_time_s:.2f} s")
    return best.model_copy(update={"notes": best.notes + [note],
                                   "solver_time_s": greedy.solver_time_s + admm.solver_time_s})


def _indices(plan: PslPlan):
    import numpy as np
    index = {h: i for i, h in enumerate(plan.helpers)}
    return np.array([index[h] for h in plan.assignment])
