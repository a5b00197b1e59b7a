"""Generators: K_p policies, compute order (Fig. 4b), sample routing, and schedules made from plans."""

import pytest

from hppctl.models.plan import PlanRequest
from hppctl.planner import make_plan
from hppctl.schedule import check_schedule, compute_order, schedule_for_plan, warmups
from hppctl.schedule.routing import Route, owned_ranges, routes
from tests.conftest import make_profile
from tests.schedule.factories import make_schedule


@pytest.mark.parametrize("policy, P, M, expected", [
    ("1f1b-asteroid", 3, 5, [5, 3, 1]),  # Fig. 4b
    ("1f1b-asteroid", 4, 4, [4, 4, 3, 1]),  # capped at M
    ("1f1b", 3, 5, [3, 2, 1]),
    ("gpipe", 3, 5, [5, 5, 5]),
    ("2(P-p)", 3, 8, [6, 4, 2]),
    ("2(P-p)+1", 3, 8, [7, 5, 3]),
    ("2(P-p)-1", 3, 8, [5, 3, 1]),
    ("P-p", 2, 1, [1, 1]),
])
def test_warmup_policies(policy, P, M, expected):
    assert warmups(policy, P, M) == expected


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown schedule policy 'zigzag'.*1f1b-asteroid"):
        warmups("zigzag", 3, 4)


def fmt(order):
    return " ".join(f"{k}{m}" for k, m in order)


@pytest.mark.parametrize("K, M, expected", [
    (5, 5, "F0 F1 F2 F3 F4 B0 B1 B2 B3 B4"),
    (3, 5, "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4"),
    (1, 5, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4"),
    (9, 2, "F0 F1 B0 B1"),
])
def test_compute_order_is_k_forwards_then_one_backward_one_forward(K, M, expected):
    assert fmt(compute_order(K, M)) == expected


@pytest.mark.parametrize("samples, expected", [
    ([3, 5], [(0, 3), (3, 8)]), ([0, 4, 0], [(0, 0), (0, 4), (4, 4)]), ([8], [(0, 8)]),
])
def test_owned_ranges_are_consecutive_in_listed_order(samples, expected):
    assert owned_ranges(samples) == expected


@pytest.mark.parametrize("up, down, expected", [
    ([3, 5], [8], [("a", "x", 0, 3), ("b", "x", 3, 8)]),
    ([8], [2, 2, 4], [("a", "x", 0, 2), ("a", "y", 2, 4), ("a", "z", 4, 8)]),
    ([3, 5], [2, 2, 4], [("a", "x", 0, 2), ("a", "y", 2, 3), ("b", "y", 3, 4), ("b", "z", 4, 8)]),
    ([4, 4], [4, 4], [("a", "x", 0, 4), ("b", "y", 4, 8)]),  # equal allocations: one peer each
    ([0, 8], [8, 0], [("b", "x", 0, 8)]),  # devices with no samples take no part
])
def test_routes_send_the_intersection_of_ranges(up, down, expected):
    names_up, names_down = ["a", "b", "c"][:len(up)], ["x", "y", "z"][:len(down)]
    assert routes(names_up, up, names_down, down) == [Route(*r) for r in expected]


def test_figure_4_example_has_allreduce_only_in_the_replicated_stage():
    # 4 devices, 3 stages, the first stage replicated on 2 devices, 5 micro-batches (Fig. 4).
    s = make_schedule([[4, 4], [8], [8]], M=5)
    check_schedule(s)
    assert [str(a) for a in s.actions["d0"][-2:]] == ["AR0", "STEP0"]
    assert not any(a.kind == "AR" for d in ("d2", "d3") for a in s.actions[d])
    assert [f"{a.kind}{a.micro_batch}" for a in s.actions["d2"] if a.kind in "FB"] == \
        "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4".split()


def test_every_device_computes_exactly_its_own_range():
    s = make_schedule([[3, 0, 5], [1, 7]], M=3)
    assert {(a.start, a.end) for a in s.actions["d0"] if a.kind in ("F", "B")} == {(0, 3)}
    assert [str(a) for a in s.actions["d1"]] == ["AR0", "STEP0"]  # no samples: only the group's AllReduce
    assert {(a.start, a.end) for a in s.actions["d2"] if a.kind in ("F", "B")} == {(3, 8)}


@pytest.fixture(scope="module")
def plan():
    profile = make_profile(layers=12, speeds=(1, 2, 3, 1), memory_gb=(4, 4, 8, 4))
    return make_plan(profile, PlanRequest(global_batch=256, micro_batch=32), "asteroid")


def test_schedule_for_plan_uses_the_plans_policy_and_allocation(plan):
    s = schedule_for_plan(plan)
    check_schedule(s)
    assert s.policy == plan.schedule and [st.warmup for st in s.stages] == [st.warmup for st in plan.stages]
    assert [st.samples for st in s.stages] == [st.samples for st in plan.stages]
    assert (s.model, s.profile_digest) == (plan.model, plan.profile_digest)


@pytest.mark.parametrize("policy", ["gpipe", "1f1b", "2(P-p)+1"])
def test_schedule_for_plan_policy_override(plan, policy):
    s = schedule_for_plan(plan, policy)
    check_schedule(s)
    assert [st.warmup for st in s.stages] == warmups(policy, len(plan.stages), plan.num_micro_batches)


def test_schedule_for_plan_explicit_warmup(plan):
    ks = [1] * len(plan.stages)
    s = schedule_for_plan(plan, warmup=ks)
    check_schedule(s)
    assert s.policy == "warmup:" + ",".join("1" for _ in ks)
    with pytest.raises(ValueError, match="one per stage: micro-batches in flight"):
        schedule_for_plan(plan, warmup=[1] * (len(plan.stages) + 1))
