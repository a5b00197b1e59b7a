"""PURE: parallel split learning planner — assign clients to helpers and order each helper's tasks.

    times = pair_times(profile, request)           # the paper's r, p, l, l′, p′, r′ + memory
    plan = plan_psl(profile, request, "auto")      # -> PslPlan (assignment, per-helper order, makespan)

Methods (docs/psl.md): `balanced-greedy` and `random-fcfs` (non-preemptive FCFS, in seconds),
`admm` (the paper's decomposition) and `exact` (the integer program P, HiGHS) on a slot grid,
and `auto`: the best of every method it can afford (balanced-greedy; admm up to 50 clients; the
exhaustive `search` up to 8 clients, optimal when it finishes; exact up to 10 clients and 3 helpers
when the search did not finish), every candidate ranked by its makespan as the runtime runs it
(whole tasks, unrounded seconds: `sequence.as_run`), which is also what its plan predicts.
Imports numpy; scipy only when admm/exact solve.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from hppctl.errors import BadInput, Infeasible
from hppctl.limits import MAX_PSL_SLOTS
from hppctl.models.profile import Profile
from hppctl.models.psl import METHODS, PslPlan, PslRequest, PslTimes
from hppctl.planner.psl.build import to_plan
from hppctl.planner.psl.fcfs import fcfs_timeline
from hppctl.planner.psl.admm import RHO
from hppctl.planner.psl.instance import Instance, Timeline, auto_slot
from hppctl.planner.psl.memory import check_memory
from hppctl.planner.psl.search import MAX_NODES as SEARCH_MAX_NODES, search
from hppctl.planner.psl.sequence import as_run
from hppctl.planner.psl.times import pair_times

__all__ = ["AUTO_ADMM_MAX_CLIENTS", "AUTO_EXACT_MAX_CLIENTS", "AUTO_EXACT_MAX_HELPERS", "AUTO_SEARCH_MAX_CLIENTS",
           "DEFAULT_TARGET_SLOTS", "METHODS", "pair_times", "plan_psl", "plan_times"]

AUTO_ADMM_MAX_CLIENTS = 50
"""auto runs the decomposition up to this many clients (paper §VII: ADMM for medium sizes, up to
50 clients; balanced-greedy for 100 and more, where the solver's overhead is not worth it)."""
AUTO_SEARCH_MAX_CLIENTS = 8
"""auto runs the exhaustive search (`search.py`, at most SEARCH_MAX_NODES nodes) up to this many clients."""
AUTO_EXACT_MAX_CLIENTS = 10
AUTO_EXACT_MAX_HELPERS = 3
"""auto runs the integer program (bounded by `time_limit_s`) up to this size when the search did not
prove an optimum: the bench's exact instances (J <= 10, I <= 3) all solve to optimality in <= 12 s."""
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
               time_limit_s: float = DEFAULT_TIME_LIMIT_S, rho: float = RHO) -> PslPlan:
    """Solve an instance with one method.

    `slot_s` fixes the slot of admm/exact (default: sized from `target_slots`); `seed` drives
    random-fcfs; `time_limit_s` bounds each solver; `rho` is admm's penalty.
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
        return _auto(instance, slot, common, options)
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


@dataclass(frozen=True)
class _Candidate:
    label: str
    method: str
    """The `PslPlan.method` that produced it."""
    timeline: Timeline
    """In seconds, whole tasks: as the runtime runs it (`sequence.as_run`)."""


def _auto(instance: Instance, slot: float, common: dict, options: _Options) -> PslPlan:
    """Every method auto can afford (docs/psl.md, `auto`), each plan ranked as the runtime runs it;
    the best is returned, so auto is never worse than a plan it computed. Ties keep the earlier one."""
    started = time.perf_counter()
    clients = common["request"].clients
    candidates: list[_Candidate] = []
    notes: list[str] = []
    failures: list[Infeasible] = []
    J, I = instance.num_clients, instance.num_helpers
    _offer_greedy(instance, clients, candidates, failures)
    if J > AUTO_ADMM_MAX_CLIENTS:
        notes.append(f"auto: {J} clients > {AUTO_ADMM_MAX_CLIENTS}: balanced-greedy (paper §VII)")
    else:
        _offer_slot_method("admm", instance, slot, clients, options, candidates, notes, failures)
    proven = J <= AUTO_SEARCH_MAX_CLIENTS and _offer_search(instance, candidates, notes)
    if not proven and J <= AUTO_EXACT_MAX_CLIENTS and I <= AUTO_EXACT_MAX_HELPERS:
        _offer_slot_method("exact", instance, slot, clients, options, candidates, notes, failures)
    if not candidates:
        raise failures[0]
    best = min(candidates, key=lambda c: c.timeline.makespan)  # min keeps the first of equals
    ranked = ", ".join(f"{c.label} {c.timeline.makespan:.4g} s" for c in candidates)
    notes.append(f"auto: as run (whole tasks, unrounded times): {ranked}; kept {best.label}")
    return to_plan(best.timeline, method=best.method, instance=instance, slot_s=None,
                   solver_time_s=time.perf_counter() - started, notes=notes, **common)


def _offer_greedy(instance: Instance, clients, candidates: list[_Candidate], failures: list[Infeasible]) -> None:
    from hppctl.planner.psl.greedy import balanced_greedy
    try:
        candidates.append(_Candidate("balanced-greedy", "balanced-greedy", balanced_greedy(instance, clients)))
    except Infeasible as e:  # count-based packing can strand a client that admm, search or exact place
        failures.append(e)


def _offer_slot_method(method: str, instance: Instance, slot: float, clients, options: _Options,
                       candidates: list[_Candidate], notes: list[str], failures: list[Infeasible]) -> None:
    """A slot plan as the runtime runs it (tasks whole, in the order the plan completes them), and
    its assignment with FCFS: either can be the better once the slot rounding is gone."""
    method_notes: list[str] = []
    try:
        timeline = _slot_method(method, _slot_grid(instance, slot), clients, options, method_notes)
    except Infeasible as e:
        failures.append(e)
        return
    notes.extend(method_notes)
    candidates.append(_Candidate(method, method, as_run(instance, timeline)))
    candidates.append(_Candidate(f"{method}'s assignment + FCFS", method, fcfs_timeline(instance, timeline.assignment)))


def _offer_search(instance: Instance, candidates: list[_Candidate], notes: list[str]) -> bool:
    """The exhaustive search, pruned by the best candidate so far; true when it proved the optimum."""
    incumbent = min((c.timeline.makespan for c in candidates), default=math.inf)
    result = search(instance, incumbent, SEARCH_MAX_NODES)
    if result.timeline is not None:
        candidates.append(_Candidate("search", "search", result.timeline))
    outcome = "optimal (every assignment and order covered)" if result.complete else \
        f"stopped at its budget of {SEARCH_MAX_NODES} nodes"
    notes.append(f"auto: search {outcome}, {result.nodes} nodes")
    return result.complete
