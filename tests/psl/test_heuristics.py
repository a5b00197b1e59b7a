"""balanced-greedy, random + FCFS, and the FCFS helper schedule, on hand-checked instances."""

import numpy as np
import pytest

from hppctl.errors import Infeasible
from hppctl.planner.psl import plan_times
from hppctl.planner.psl.fcfs import fcfs_timeline
from hppctl.planner.psl.greedy import balanced_assignment
from hppctl.planner.psl.instance import Instance
from hppctl.planner.psl.random_fcfs import random_assignment
from tests.psl.factories import GB, make_times, request_for


def test_balanced_greedy_takes_the_least_loaded_helper_with_room():
    # h0 holds 2 clients, h1 and h2 hold 1 each (4 GB per client)
    times = make_times(r=0, p=[[1] * 5] * 3, l=0, lp=0, pp=1, rp=0, demand=[4 * GB] * 5,
                       capacity=[8 * GB, 4 * GB, 8 * GB])
    a = balanced_assignment(Instance.from_times(times), request_for(times).clients)
    # c0 -> h0 (all empty, lowest index), c1 -> h1, c2 -> h2, c3 -> h0 (h1 full; h0, h2 tie), c4 -> h2
    assert a.tolist() == [0, 1, 2, 0, 2]


def test_balanced_greedy_names_the_client_it_cannot_place():
    # 3, 3 and 2 GB on two 4 GB helpers: c0 -> h0, c1 -> h1, then 1 GB is left on each
    times = make_times(r=0, p=[[1] * 3] * 2, l=0, lp=0, pp=1, rp=0, demand=[3 * GB, 3 * GB, 2 * GB],
                       capacity=[4 * GB, 4 * GB])
    with pytest.raises(Infeasible, match="balanced-greedy: no helper has 2.00 GB free for client 'c2'"):
        balanced_assignment(Instance.from_times(times), request_for(times).clients)


def test_random_assignment_is_seeded_and_memory_feasible():
    times = make_times(r=0, p=[[1] * 12] * 3, l=0, lp=0, pp=1, rp=0, demand=[GB] * 12, capacity=[4 * GB] * 3)
    inst = Instance.from_times(times)
    a = random_assignment(inst, request_for(times).clients, seed=3)
    assert a.tolist() == random_assignment(inst, request_for(times).clients, seed=3).tolist()
    assert np.bincount(a, minlength=3).tolist() == [4, 4, 4]
    assert a.tolist() != random_assignment(inst, request_for(times).clients, seed=4).tolist()


def test_fcfs_mixes_forward_and_backward_tasks_in_arrival_order():
    # One helper, two clients. c0: r=0 p=2 l+l'=1 p'=2 r'=1; c1: r=1 p=1 l+l'=5 p'=1 r'=0.
    times = make_times(r=[[0, 1]], p=[[2, 1]], l=[[1, 2]], lp=[[0, 3]], pp=[[2, 1]], rp=[[1, 0]])
    t = fcfs_timeline(Instance.from_times(times), np.array([0, 0]))
    # F0 [0,2); F1 [2,3) (arrived at 1); B0 arrives 3 -> [3,5); B1 arrives 3+5=8 -> [8,9)
    assert [(p.kind, p.client, p.start, p.end) for p in t.pieces[0]] == \
        [("F", 0, 0, 2), ("F", 1, 2, 3), ("B", 0, 3, 5), ("B", 1, 8, 9)]
    assert t.completion.tolist() == [6, 9] and t.makespan == 9


def test_plans_record_method_assignment_and_solver_time():
    times = make_times(r=0, p=[[1, 2], [2, 1]], l=0, lp=0, pp=1, rp=0)
    plan = plan_times(times, request_for(times), "balanced-greedy")
    assert plan.method == "balanced-greedy" and plan.slot_s is None
    assert plan.assignment == ["h0", "h1"]
    assert [h.clients for h in plan.helper_plans] == [["c0"], ["c1"]]
    assert plan.solver_time_s >= 0 and plan.prediction.makespan_slots is None
