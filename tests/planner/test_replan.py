"""Light and heavy re-planning after a device is lost; migrations; backup targets."""

import pytest

from hppctl.errors import BadInput
from hppctl.models.plan import PlanRequest
from hppctl.planner import make_plan
from hppctl.planner.replan import (backup_targets, flops_proportional_cuts, migrations, replan_heavy, replan_light,
                                   without_devices)
from tests.conftest import make_profile


def plan_with(stages_devices, layers=12, speeds=(2, 1, 1, 1), memory_gb=(8, 8, 8, 8), **kw):
    """A plan whose stages use the given device groups, by re-planning until the shape matches."""
    profile = make_profile(layers=layers, speeds=speeds, memory_gb=memory_gb, **kw)
    return profile, make_plan(profile, PlanRequest(global_batch=256, micro_batch=32), "pp")


def test_cuts_follow_capacity_shares():
    profile = make_profile(layers=10, speeds=(1,))
    flops = [l.forward_flops_per_sample for l in profile.layers]
    cuts = flops_proportional_cuts(profile, [1.0, 3.0])
    share = sum(flops[:cuts[1]]) / sum(flops)
    assert cuts[0] == 0 and cuts[-1] == 10 and abs(share - 0.25) < 0.15


def test_every_stage_keeps_a_layer():
    profile = make_profile(layers=3, speeds=(1,))
    assert flops_proportional_cuts(profile, [100.0, 0.001, 0.001]) == [0, 1, 2, 3]


def test_losing_a_single_device_stage_merges_its_layers_into_the_others():
    profile, plan = plan_with(None)
    assert len(plan.stages) >= 2 and all(len(s.devices) == 1 for s in plan.stages)
    lost = plan.stages[1].devices[0]
    result = replan_light(plan, profile, lost)
    new = result.plan
    assert result.method == "light" and len(new.stages) == len(plan.stages) - 1
    assert lost not in new.devices() and new.stages[0].start == 0 and new.stages[-1].end == 12
    assert not new.memory_violations
    # the lost stage's layers come from its backup (source None) or a surviving holder
    moved = {l for m in result.migrations for l in range(m.start, m.end)}
    assert set(range(plan.stages[1].start, plan.stages[1].end)) <= moved
    for m in result.migrations:
        assert m.source != lost


def test_losing_a_replica_keeps_the_stage_and_reallocates_its_samples():
    profile = make_profile(layers=8, speeds=(1, 1, 1), memory_gb=(8, 8, 8))
    plan = make_plan(profile, PlanRequest(global_batch=256, micro_batch=32), "dp")
    assert len(plan.stages) == 1 and len(plan.stages[0].devices) == 3
    result = replan_light(plan, profile, plan.stages[0].devices[0])
    assert len(result.plan.stages) == 1 and len(result.plan.stages[0].devices) == 2
    assert sum(result.plan.stages[0].samples) == 32 and result.migrations == []


def test_light_falls_back_to_heavy_when_memory_does_not_fit():
    # found by search: losing dev2 leaves its layers to a stage whose device cannot hold them,
    # while the full planner regroups the survivors
    import random

    rng = random.Random(8)
    n = rng.randint(3, 4)
    profile = make_profile(layers=rng.randint(4, 10), speeds=[rng.uniform(0.5, 3) for _ in range(n)],
                           memory_gb=[rng.choice([0.02, 0.05, 0.2, 1]) for _ in range(n)], seed=8,
                           activation_scale=rng.choice([5, 20]))
    plan = make_plan(profile, PlanRequest(global_batch=64, micro_batch=8), "asteroid")
    result = replan_light(plan, profile, "dev2")
    assert result.method == "heavy" and "memory" in result.fallback_reason
    assert not result.plan.memory_violations and "dev2" not in result.plan.devices()


def test_heavy_uses_the_full_planner_on_survivors():
    profile, plan = plan_with(None)
    lost = plan.stages[0].devices[0]
    result = replan_heavy(plan, profile, lost)
    assert lost not in result.plan.devices() and result.plan.profile_digest == without_devices(profile, lost).digest()


def test_migrations_list_only_layers_that_change_owner():
    profile, plan = plan_with(None)
    same = migrations(plan, plan, lost="nobody")
    assert same == []


def test_backup_targets_form_a_ring_over_single_device_stages():
    profile, plan = plan_with(None)
    targets = backup_targets(plan)
    firsts = [s.devices[0] for s in plan.stages]
    for p, stage in enumerate(plan.stages):
        assert targets[stage.devices[0]] == firsts[(p + 1) % len(firsts)]


def test_unknown_device():
    profile, plan = plan_with(None)
    with pytest.raises(BadInput, match="not in the profile"):
        replan_light(plan, profile, "ghost")


def test_losing_two_devices_at_once_drops_both_and_fetches_each_stage_from_its_own_backup():
    profile, plan = plan_with(None, layers=16, speeds=(1, 1, 1, 1))
    assert len(plan.stages) == 4 and all(len(s.devices) == 1 for s in plan.stages)
    lost = [plan.stages[1].devices[0], plan.stages[3].devices[0]]
    result = replan_light(plan, profile, lost)
    assert result.method == "light" and len(result.plan.stages) == 2 and not set(lost) & set(result.plan.devices())
    assert result.profile.digest() == without_devices(profile, lost).digest()
    owner = {layer: s.devices[0] for s in plan.stages for layer in range(s.start, s.end)}
    for m in result.migrations:
        assert m.source not in lost
        if m.source is None:  # a lost stage's layers: from that stage's own device's backup
            assert {owner[layer] for layer in range(m.start, m.end)} == {m.backup_of}
    assert {m.backup_of for m in result.migrations} - {None} == set(lost)


def split_run(lost_index: int = 1):
    """A split-backward pp plan over a profile with weight-gradient times, and the device to lose."""
    from hppctl.planner.split_backward import with_split_backward
    from tests.planner.test_split_backward_plan import with_weight_times

    profile = with_weight_times(make_profile(layers=12, speeds=(2, 1, 1, 1), memory_gb=(8, 8, 8, 8)), 0.3)
    plan = with_split_backward(make_plan(profile, PlanRequest(global_batch=256, micro_batch=32), "pp"), profile)
    return profile, plan, plan.stages[lost_index].devices[0]


@pytest.mark.parametrize("replanner", [replan_light, replan_heavy])
def test_a_split_backward_plan_is_replanned_with_split_backwards(replanner):
    """The run keeps the schedule it was planned with: its re-planned stages defer their weight
    gradients too, each with its weight time from the survivors' profile."""
    from hppctl.planner.split_backward import with_split_backward
    from hppctl.schedule import check_schedule, schedule_for_plan

    profile, plan, lost = split_run()
    result = replanner(plan, profile, lost)
    assert result.plan.split_backward and result.split_dropped == ""
    assert result.plan.stages == with_split_backward(result.plan, result.profile).stages
    assert [(s.layers, s.devices) for s in result.plan.stages] == \
        [(s.layers, s.devices) for s in replanner(plan.model_copy(update={"split_backward": False}), profile, lost).plan.stages]
    check_schedule(schedule_for_plan(result.plan))


def test_a_split_plan_whose_survivors_cannot_split_is_replanned_with_whole_backwards_saying_why():
    profile, plan, lost = split_run()
    bare = profile.model_copy(update={"devices": [d.model_copy(update={"weight_grad_s": None}) for d in profile.devices]})
    result = replan_light(plan, bare, lost)
    assert not result.plan.split_backward and "no weight_grad_s" in result.split_dropped


def test_a_plan_with_whole_backwards_stays_so():
    profile, plan, lost = split_run()
    result = replan_light(plan.model_copy(update={"split_backward": False}), profile, lost)
    assert not result.plan.split_backward and result.split_dropped == ""
