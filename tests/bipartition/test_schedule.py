"""Tier 1: Bi-Partition actions in the schedule generator, checker and simulator."""

from __future__ import annotations

import pytest

from hppctl.models.plan import PlanRequest
from hppctl.models.schedule import Schedule
from hppctl.planner import make_plan
from hppctl.planner.bipartition import costs_from_model, evaluate
from hppctl.planner.cost import CostModel
from hppctl.schedule import ScheduleError, check_schedule, schedule_for_plan, simulate_plan
from tests.bipartition.factories import bi_plan
from tests.bipartition.test_planner import paper_profile
from tests.conftest import make_profile

# Worker b backwards layer 1 (prefix split: forwarded by a) and worker c's layer 4 is backwarded by
# b (suffix split: forwarded by c); worker c is then F-only for layer 4 and runs layer 5 both ways.
CUTS = dict(forward=[0, 2, 4, 6], backward=[0, 1, 5, 6])


def prefix_suffix_schedule(M: int = 3) -> Schedule:
    return schedule_for_plan(bi_plan("synthetic-6", **CUTS, devices=["a", "b", "c"], global_batch=2 * M, micro_batch=2))


def texts(schedule: Schedule, device: str) -> list[str]:
    return [str(a) for a in schedule.actions[device]]


def test_paper_plan_sends_the_split_layer_weights_back_after_step():
    plan = make_plan(paper_profile(), PlanRequest(global_batch=4, micro_batch=1), "bipartition-paper")
    schedule = schedule_for_plan(plan)
    check_schedule(schedule)
    assert texts(schedule, "D1")[-2:] == ["STEP0", "SW0>D2"]  # layer 2: backward on D1, forward on D2
    assert texts(schedule, "D2")[-2:] == ["STEP1", "RW1<D1"]
    assert schedule.stages[0].backward_layers == [0, 2]
    assert not any(a.kind in ("SX", "RX") for acts in schedule.actions.values() for a in acts)


def test_prefix_split_gets_its_input_after_each_activation():
    schedule = prefix_suffix_schedule()
    check_schedule(schedule)
    a, b = texts(schedule, "a"), texts(schedule, "b")
    for m in range(3):
        assert a[a.index(f"{m}SA0>b[0:2]") + 1] == f"{m}SX0>b[0:2]"
        assert b[b.index(f"{m}RA1<a[0:2]") + 1] == f"{m}RX1<a[0:2]"
    assert a[-2:] == ["STEP0", "RW0<b"] and b[-3:] == ["STEP1", "SW1>a", "SW1>c"] and texts(schedule, "c")[-1] == "RW2<b"


def test_schedule_round_trips_through_json():
    schedule = prefix_suffix_schedule()
    assert Schedule.model_validate_json(schedule.model_dump_json()) == schedule


def _edit(schedule: Schedule, device: str, fn) -> Schedule:
    actions = {d: list(a) for d, a in schedule.actions.items()}
    actions[device] = fn(actions[device])
    return Schedule(**{**schedule.model_dump(exclude={"actions", "stages"}), "stages": schedule.stages,
                       "actions": actions})


@pytest.mark.parametrize("device, edit, message", [
    ("b", lambda acts: [x for x in acts if str(x) != "1RX1<a[0:2]"], "micro-batch 1"),
    ("a", lambda acts: [acts[-1]] + acts[:-1], "weights move before STEP"),
    ("b", lambda acts: [x for x in acts if x.kind != "SW" or x.peer != "c"], "missing SW with c"),
])
def test_checker_names_the_broken_rule(device, edit, message):
    with pytest.raises(ScheduleError, match=message):
        check_schedule(_edit(prefix_suffix_schedule(), device, edit))


def test_checker_finds_the_deadlock_of_a_split_input_sent_before_the_activations():
    def swap(acts):
        i = [str(x) for x in acts].index("0SA0>b[0:2]")
        return acts[:i] + [acts[i + 1], acts[i]] + acts[i + 2:]
    with pytest.raises(ScheduleError, match="deadlock"):
        check_schedule(_edit(prefix_suffix_schedule(), "a", swap))


def test_checker_refuses_splits_between_non_neighbours():
    plan = bi_plan("synthetic-6", forward=[0, 1, 2, 6], backward=[0, 4, 5, 6], devices=["a", "b", "c"],
                   global_batch=4, micro_batch=2)
    with pytest.raises(ScheduleError, match="do not interleave"):
        check_schedule(schedule_for_plan(plan))


def test_simulator_prices_recomputation_split_inputs_and_weights():
    profile = make_profile(layers=6, speeds=(1.0, 1.0, 1.0), seed=2)
    names = [d.name for d in profile.devices]
    plan = bi_plan("synthetic-6", **CUTS, devices=names, global_batch=6, micro_batch=2)
    plan = plan.model_copy(update={"profile_digest": profile.digest()})
    schedule, result = simulate_plan(plan, profile)
    layers, B = profile.layers, 2
    links = {(link.src, link.dst): link for link in result.links}
    # a -> b: activations at cut 2 and the prefix block's input at cut 1, for 3 micro-batches
    assert links[(names[0], names[1])].bytes == 3 * B * (layers[1].boundary_bytes_per_sample
                                                         + layers[0].boundary_bytes_per_sample)
    # b -> a: gradients at cut 1, plus layer 1's weights once
    assert links[(names[1], names[0])].bytes == 3 * B * layers[0].boundary_bytes_per_sample + layers[1].param_bytes
    b = next(d for d in result.devices if d.device == names[1])
    dev = profile.devices[1]
    forward = sum(dev.forward_s[l][1] for l in (2, 3))
    backward = sum(dev.backward_s[l][1] for l in (1, 2, 3, 4)) + sum(dev.forward_s[l][1] for l in (1, 4))
    assert b.compute_s == pytest.approx(3 * (forward + backward))


def test_simulated_peak_memory_is_the_planners():
    profile = make_profile(layers=6, speeds=(1.0, 1.0, 1.0), seed=2)
    plan = bi_plan("synthetic-6", **CUTS, devices=[d.name for d in profile.devices], global_batch=8, micro_batch=2)
    _, result = simulate_plan(plan.model_copy(update={"profile_digest": profile.digest()}), profile)
    cm = CostModel(profile, micro_batch=2, num_micro_batches=4)
    planned = evaluate(costs_from_model(cm, [0, 1, 2]), CUTS["forward"], CUTS["backward"]).memory_bytes
    assert [d.peak_in_flight_micro_batches for d in result.devices] == [4, 3, 1]  # K_w = min(2(W-w)-1, M), M = 4
    assert [d.peak_memory_bytes for d in result.devices] == [pytest.approx(m, abs=8) for m in planned]
