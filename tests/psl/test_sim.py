"""The makespan simulator against the planners' own timelines, what-if policies, trace, plan checks."""

import pytest
from pydantic import ValidationError

from hppctl.models.psl import PslPlan
from hppctl.planner.psl import plan_times
from hppctl.planner.psl.instance import Instance, auto_slot
from hppctl.schedule.psl_sim import psl_trace, simulate_psl
from tests.psl.factories import preset_times


@pytest.fixture(scope="module")
def instance():
    return preset_times(2, clients=6, helpers=2, seed=4)


@pytest.fixture(scope="module")
def plans(instance):
    times, request = instance
    slot = auto_slot(Instance.from_times(times), 40)
    return {m: plan_times(times, request, m, slot_s=slot, time_limit_s=20)
            for m in ("balanced-greedy", "random-fcfs", "admm", "exact")}


@pytest.mark.parametrize("method", ["balanced-greedy", "random-fcfs"])
def test_replaying_an_fcfs_plan_gives_its_prediction(plans, method):
    plan = plans[method]
    result = simulate_psl(plan)
    assert result.makespan_s == pytest.approx(plan.prediction.makespan_s, rel=1e-12)
    assert [c.completion_s for c in result.clients] == pytest.approx([c.completion_s for c in plan.prediction.clients])
    assert simulate_psl(plan, policy="fcfs").makespan_s == pytest.approx(result.makespan_s)


@pytest.mark.parametrize("method", ["admm", "exact"])
def test_a_slot_plan_finishes_no_later_than_its_rounded_prediction(plans, method):
    plan = plans[method]
    result = simulate_psl(plan)
    assert plan.prediction.lower_bound_s <= result.makespan_s <= plan.prediction.makespan_s + 1e-9
    assert result.makespan_s > 0.8 * plan.prediction.makespan_s  # rounding costs at most a few slots


def test_every_policy_respects_each_clients_path(plans, instance):
    times, _ = instance
    inst = Instance.from_times(times)
    path = inst.path()
    plan = plans["exact"]
    helper = {h: i for i, h in enumerate(plan.helpers)}
    for policy in ("plan", "fcfs", "ltf"):
        result = simulate_psl(plan, policy=policy)
        for j, c in enumerate(result.clients):
            assert c.completion_s >= path[helper[c.helper], j] - 1e-9
            assert c.completion_s == pytest.approx(path[helper[c.helper], j] + c.queueing_s)
        assert sum(h.clients for h in result.helpers) == len(plan.clients)


def test_a_slower_helper_never_helps(plans):
    plan = plans["balanced-greedy"]
    base = simulate_psl(plan).makespan_s
    slower = simulate_psl(plan, slowdown={plan.helpers[0]: 3.0}).makespan_s
    assert slower >= base


def test_trace_has_a_row_per_device_and_complete_events(plans):
    plan = plans["admm"]
    trace = psl_trace(simulate_psl(plan, trace=True))
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert set(plan.clients) <= names and {h.helper for h in plan.helper_plans if h.clients} <= names
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert events and all(e["dur"] >= 0 for e in events)
    assert sum(e["cat"] == "helper-B" for e in events) >= len(plan.clients)


def broken(plan: PslPlan, change) -> dict:
    data = plan.model_dump(mode="json")
    change(data)
    return data


@pytest.mark.parametrize("change,match", [
    (lambda d: d["helper_plans"][0]["sequence"].reverse(), "before its F task is done"),
    (lambda d: d["helper_plans"][0]["sequence"].pop(), "add up to 0"),
    (lambda d: d["helper_plans"][0].update(memory_budget_bytes=1), "exceeds its budget"),
    (lambda d: d["assignment"].__setitem__(0, "nobody"), "unknown helper"),
    (lambda d: d["times"]["p_s"][0].pop(), "must be 2 helpers x 6 clients"),
])
def test_plan_files_are_checked(plans, change, match):
    with pytest.raises(ValidationError, match=match):
        PslPlan.model_validate(broken(plans["balanced-greedy"], change))
