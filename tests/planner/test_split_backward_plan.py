"""A plan turned into its split-backward form: weight times, memory caps, prediction by simulation."""

from __future__ import annotations

import pytest

from hppctl.models.plan import PlanRequest
from hppctl.planner import make_plan
from hppctl.planner.cost import CostModel
from hppctl.planner.split_backward import with_split_backward
from hppctl.schedule import ProfileTimings, check_schedule, schedule_for_plan, simulate, simulate_plan, split_backward_plan
from tests.conftest import make_profile


def with_weight_times(profile, share: float):
    devices = [d.model_copy(update={"weight_grad_s": [[share * b for b in row] for row in d.backward_s]})
               for d in profile.devices]
    return profile.model_copy(update={"devices": devices})


@pytest.mark.parametrize("seed", range(4))
def test_split_plans_check_fit_their_memory_and_take_each_stage_s_weight_time(seed):
    profile = with_weight_times(make_profile(layers=8, speeds=(1.0, 2.0, 3.0, 1.5), seed=seed), 0.4)
    request = PlanRequest(global_batch=64, micro_batch=8)
    for strategy in ("asteroid", "pp"):
        plan = make_plan(profile, request, strategy)
        split = with_split_backward(plan, profile)
        cm = CostModel(profile, micro_batch=8, num_micro_batches=8)
        index = {n: i for i, n in enumerate(cm.names)}
        for p, (before, after) in enumerate(zip(plan.stages, split.stages)):
            assert min(before.warmup, 8) <= after.in_flight_cap <= 8
            assert all(m <= b for m, b in zip(after.memory_bytes, after.memory_budget_bytes))
            weights = [cm.weight_grad_time(index[d], *after.layers, y) for d, y in zip(after.devices, after.samples) if y]
            assert after.weight_grad_s == (after.backward_s if p == 0 else min(max(weights), after.backward_s))
        schedule = schedule_for_plan(split)
        check_schedule(schedule)
        assert {a.kind for acts in schedule.actions.values() for a in acts} >= {"I", "W"}


def test_profile_timings_split_the_backward_and_the_head_defers_all_of_it():
    profile = with_weight_times(make_profile(layers=6, speeds=(1.0, 2.0)), 0.25)
    plan = with_split_backward(make_plan(profile, PlanRequest(global_batch=16, micro_batch=4), "pp"), profile)
    timings = ProfileTimings(profile, schedule_for_plan(plan))
    for p, stage in enumerate(plan.stages):
        d, y = stage.devices[0], stage.samples[0]
        whole = timings.compute_s(d, p, "B", y)
        i, w = timings.compute_s(d, p, "I", y), timings.compute_s(d, p, "W", y)
        assert i + w == pytest.approx(whole)
        assert (i, w) == ((0.0, whole) if p == 0 else (pytest.approx(0.75 * whole), pytest.approx(0.25 * whole)))


def test_profile_timings_refuse_a_cost_model_of_another_micro_batch_or_profile():
    profile = with_weight_times(make_profile(layers=6, speeds=(1.0, 2.0)), 0.25)
    schedule = schedule_for_plan(make_plan(profile, PlanRequest(global_batch=16, micro_batch=4), "pp"))
    ProfileTimings(profile, schedule, cm=CostModel(profile, micro_batch=4, num_micro_batches=4))
    for cm in (CostModel(profile, micro_batch=8, num_micro_batches=2),
               CostModel(with_weight_times(profile, 0.5), micro_batch=4, num_micro_batches=4)):
        with pytest.raises(ValueError, match="not the profile's at the schedule's micro-batches"):
            ProfileTimings(profile, schedule, cm=cm)


def test_the_prediction_is_the_simulated_round():
    profile = with_weight_times(make_profile(layers=8, speeds=(1.0, 2.0, 3.0)), 0.4)
    plan = make_plan(profile, PlanRequest(global_batch=64, micro_batch=8), "pp")
    split = split_backward_plan(plan, profile)
    assert split.prediction.round_latency_s == simulate_plan(split, profile)[1].round_latency_s
    assert split.prediction.round_latency_s < simulate_plan(plan, profile)[1].round_latency_s


def test_a_profile_without_weight_times_is_refused_naming_the_devices():
    profile = make_profile(layers=6, speeds=(1.0, 2.0))
    plan = make_plan(profile, PlanRequest(global_batch=16, micro_batch=4), "pp")
    with pytest.raises(ValueError, match="no weight_grad_s for dev0, dev1"):
        with_split_backward(plan, profile)


def test_plan_cli_writes_a_split_plan_and_refuses_a_profile_without_weight_times(cli, tmp_path):
    profile = with_weight_times(make_profile(layers=8, speeds=(1.0, 2.0, 3.0)), 0.4)
    source = tmp_path / "p.json"
    source.write_text(profile.model_dump_json())
    code, out, _ = cli("plan", "--profile", source, "--global-batch", 64, "--micro-batch", 8, "--strategy", "pp",
                       "--split-backward", "--out", tmp_path / "plan.json")
    assert code == 0 and "split backward" in out
    assert '"split_backward": true' in (tmp_path / "plan.json").read_text()
    code, _, _ = cli("plan", "--profile", source, "--global-batch", 64, "--micro-batch", 8, "--out", tmp_path / "whole.json")
    assert code == 0 and "split_backward" not in (tmp_path / "whole.json").read_text()  # omitted when false
    code, out, _ = cli("simulate", "--plan", tmp_path / "plan.json", "--profile", source)
    assert code == 0 and "with split backwards" in out.splitlines()[0]
    code, _, err = cli("simulate", "--plan", tmp_path / "plan.json", "--profile", source, "--policy", "nf1b")
    assert code == 2 and "split backwards run only in synchronous schedules" in err
    bare = tmp_path / "bare.json"
    bare.write_text(make_profile(layers=8, speeds=(1.0, 2.0, 3.0)).model_dump_json())
    code, _, err = cli("plan", "--profile", bare, "--global-batch", 64, "--micro-batch", 8, "--split-backward")
    assert code == 2 and err.count("\n") == 1 and "--split-backward" in err and "weight_grad_s" in err


def test_the_cut_search_only_moves_cuts_and_never_slows_the_split_plan():
    faster = 0
    for seed in range(6):
        profile = with_weight_times(make_profile(layers=12, speeds=(1.0, 2.0, 3.0, 1.5), seed=seed), 0.4)
        plan = make_plan(profile, PlanRequest(global_batch=64, micro_batch=8), "pp")
        plain, tuned = split_backward_plan(plan, profile, refine=False), split_backward_plan(plan, profile)
        assert [(s.devices, s.samples) for s in tuned.stages] == [(s.devices, s.samples) for s in plan.stages]
        assert tuned.prediction.round_latency_s <= plain.prediction.round_latency_s
        assert tuned.prediction.round_latency_s == simulate_plan(tuned, profile)[1].round_latency_s
        assert tuned.profile_digest == profile.digest()  # the search's one cost model hashes it once
        assert all(m <= b for s in tuned.stages for m, b in zip(s.memory_bytes, s.memory_budget_bytes))
        faster += tuned.prediction.round_latency_s < plain.prediction.round_latency_s
    assert faster >= 2  # seeds 2 and 4 move a cut by one layer (0.520 -> 0.506 s, 0.399 -> 0.391 s)


def test_a_split_that_does_not_fit_is_infeasible_naming_the_device():
    """Held for its W, a micro-batch keeps HELD_FOR_W x its activations: a budget that fits the whole
    backwards' K_p micro-batches may not fit the split's."""
    from hppctl.errors import Infeasible
    from hppctl.planner.split_backward import HELD_FOR_W

    profile = with_weight_times(make_profile(layers=6, speeds=(1.0, 2.0)), 0.4)
    plan = make_plan(profile, PlanRequest(global_batch=16, micro_batch=4), "pp")
    stage = plan.stages[0]
    tight = int(stage.memory_bytes[0] * (1 + HELD_FOR_W) / 2)  # between Eq. 3 and the split's need
    devices = [d.model_copy(update={"memory_bytes": tight}) if d.name == stage.devices[0] else d for d in profile.devices]
    squeezed = plan.model_copy(update={"stages": [stage.model_copy(update={"memory_budget_bytes": [tight]}),
                                                  *plan.stages[1:]]})
    with pytest.raises(Infeasible, match=f"{stage.devices[0]} \\(stage 0\\) needs"):
        with_split_backward(squeezed, profile.model_copy(update={"devices": devices}))
