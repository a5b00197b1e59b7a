"""Light re-planning's cut points: the DP is exact for Eq. 4's C, and on Env D it matches heavy."""

from __future__ import annotations

import itertools

import pytest

from hppctl.models.plan import PlanRequest
from hppctl.planner import cost_model, make_plan
from hppctl.planner.cost import StageChoice
from hppctl.planner.replan import cut_points_dp, replan_heavy, replan_light
from tests.conftest import make_profile


def critical_value(cm, stages) -> float:
    """Eq. 4's C = max_s [M x_s + sum_{i<s} x_i] over stage and transfer steps (x = E_f + E_b)."""
    xs = [s.forward_s + s.backward_s for s in cm.steps(stages)]
    return max(cm.M * x + sum(xs[:i]) for i, x in enumerate(xs))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_dp_finds_the_best_cuts_of_an_exhaustive_search(seed):
    profile = make_profile(layers=9, speeds=(1.0, 2.5, 0.7), seed=seed)
    cm = cost_model(profile, PlanRequest(global_batch=32, micro_batch=8))
    groups = [(0,), (1,), (2,)]
    best = min(critical_value(cm, [StageChoice(a, b, g, (cm.B,)) for (a, b), g in zip(zip((0, c1, c2), (c1, c2, 9)), groups)])
               for c1, c2 in itertools.combinations(range(1, 9), 2))
    found = cut_points_dp(cm, groups)
    assert critical_value(cm, found) == pytest.approx(best, rel=1e-12)


def env_d(global_batch: int, micro_batch: int):
    from hppctl.models.cluster import ClusterSpec
    from hppctl.store import load
    from tests.recovery.factories import preset_profile

    cluster = load("profiles/env-d.yaml", ClusterSpec)
    profile = preset_profile("mobilenetv2", {d.name: d.preset for d in cluster.devices})
    return profile, make_plan(profile, PlanRequest(global_batch=global_batch, micro_batch=micro_batch))


@pytest.mark.parametrize("global_batch,micro_batch", [(64, 16), (256, 32)])
def test_light_replanning_reaches_90_percent_of_heavy_on_env_d(global_batch, micro_batch):
    # before the DP, losing nano1 at (256, 32) left light at 65% of heavy (FLOPs cuts + hill climbing)
    profile, plan = env_d(global_batch, micro_batch)
    for device in plan.devices():
        light, heavy = replan_light(plan, profile, device), replan_heavy(plan, profile, device)
        assert light.method == "light"
        ratio = light.plan.prediction.throughput_samples_per_s / heavy.plan.prediction.throughput_samples_per_s
        assert ratio >= 0.9, (device, ratio)
