"""Solvers on tiny slot instances: exact = brute force; admm within the paper's gaps; heuristics feasible."""

import numpy as np
import pytest

from hppctl.errors import Infeasible
from hppctl.planner.psl import plan_times
from hppctl.planner.psl.admm import solve_admm, w_step, w_step_time_indexed
from hppctl.planner.psl.instance import Instance, auto_slot, check_slot_timeline
from hppctl.planner.psl.milp import solve_exact
from tests.psl.brute import optimum, run_makespan
from tests.psl.factories import GB, make_times, preset_times, random_times, request_for

TABLE_II_WORST_GAP = 0.149


@pytest.mark.parametrize("seed,clients", [(s, 3) for s in range(8)] + [(0, 4)])
def test_exact_matches_brute_force(seed, clients):
    times = random_times(seed, clients=clients, helpers=2)
    q = Instance.from_times(times)
    result = solve_exact(q, request_for(times).clients)
    assert result.status == "optimal"
    check_slot_timeline(q, result.timeline)
    assert result.timeline.makespan == optimum(q)


def test_exact_respects_memory():
    # Both clients are fastest on h0, but h0 holds only one of them.
    times = make_times(r=0, p=[[1, 1], [4, 4]], l=0, lp=0, pp=[[1, 1], [4, 4]], rp=0,
                       demand=[2 * GB, 2 * GB], capacity=[3 * GB, 8 * GB])
    plan = plan_times(times, request_for(times), "exact", slot_s=1.0)
    assert sorted(plan.assignment) == ["h0", "h1"]
    assert plan.prediction.makespan_slots == 8


def test_memory_infeasible_instances_raise():
    times = make_times(r=0, p=[[1, 1]], l=0, lp=0, pp=[[1, 1]], rp=0, demand=[2 * GB, 2 * GB], capacity=[3 * GB])
    for method in ("balanced-greedy", "random-fcfs", "admm", "exact", "auto"):
        with pytest.raises(Infeasible, match="helper memory|needs"):
            plan_times(times, request_for(times), method, slot_s=1.0)


@pytest.mark.parametrize("kind,seed", [(1, 0), (1, 1), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3), (2, 4), (2, 5)])
def test_admm_is_within_table_ii_gaps_on_the_papers_scenarios(kind, seed):
    """Table II: on the paper's kind of instance the decomposition is at most 14.9 % above the optimum."""
    times, request = preset_times(kind, clients=5, helpers=2, seed=seed)
    slot = auto_slot(Instance.from_times(times), 40)
    exact = plan_times(times, request, "exact", slot_s=slot, time_limit_s=20)
    admm = plan_times(times, request, "admm", slot_s=slot)
    e, a = exact.prediction.makespan_slots, admm.prediction.makespan_slots
    assert exact.notes[0].startswith("exact: optimal")
    assert e <= a <= (1 + TABLE_II_WORST_GAP) * e


@pytest.mark.parametrize("seed", range(5))
def test_nothing_beats_exact_on_random_instances(seed):
    """On arbitrary tiny instances admm can be far off (it ignores p′ when assigning, paper §VI) but
    never below the optimum, and neither can the FCFS heuristics."""
    times = random_times(100 + seed, clients=5, helpers=2)
    request = request_for(times)
    q = Instance.from_times(times)
    exact, admm = solve_exact(q, request.clients), solve_admm(q)
    e = exact.timeline.makespan
    assert exact.status == "optimal"
    assert q.lower_bound() <= e <= admm.timeline.makespan
    check_slot_timeline(q, exact.timeline)
    check_slot_timeline(q, admm.timeline)
    for method in ("balanced-greedy", "random-fcfs"):  # FCFS plans are feasible plans of P too
        assert plan_times(times, request, method).prediction.makespan_s >= e


@pytest.mark.parametrize("seed", range(6))
def test_w_step_without_time_indices_is_the_papers_w_step(seed):
    rng = np.random.default_rng(seed)
    q = Instance.from_times(random_times(200 + seed, clients=3, helpers=2))
    y = np.zeros((2, 3))
    if seed % 2:
        y[rng.integers(0, 2, size=3), np.arange(3)] = 1
    mu = rng.integers(-2, 3, size=(2, 3)).astype(float) * (seed % 3 > 0)
    horizon = int(np.ceil(q.forward_horizon()))
    rho = [350.0, 2.0, 0.5][seed % 3]

    def objective(work, finish):
        return (finish + (q.l * y).sum(axis=0)).max() + rho / 2 * np.abs(work - y * q.p + mu).sum()

    fast = w_step(q, y, mu, rho, horizon)
    slow = w_step_time_indexed(q, y, mu, rho, horizon)
    assert objective(fast[0], fast[1]) == pytest.approx(objective(slow[0], slow[1]))
    assert np.allclose((fast[0] / q.p).sum(axis=0), 1)  # (20): every client fully served


def test_auto_picks_greedy_beyond_fifty_clients():
    times = make_times(r=[[1] * 60], p=1, l=0, lp=0, pp=1, rp=1)
    plan = plan_times(times, request_for(times), "auto")
    assert plan.method == "balanced-greedy" and any("> 50" in n for n in plan.notes)


def test_auto_is_no_worse_than_admm_and_greedy_as_run():
    times = random_times(7, clients=5, helpers=2)
    request = request_for(times)
    plans = {m: plan_times(times, request, m, slot_s=1.0) for m in ("balanced-greedy", "admm")}
    auto = plan_times(times, request, "auto", slot_s=1.0)
    assert run_makespan(auto) <= min(run_makespan(p) for p in plans.values())
    assert auto.requested_method == "auto" and auto.method in ("balanced-greedy", "admm", "search")
