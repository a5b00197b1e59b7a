"""The example plan in plans/ loads, matches its profile, and is what the planner produces today."""

from pathlib import Path

from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.models.profile import Profile
from hppctl.planner import make_plan
from hppctl.planner.explain import check_plan_matches
from hppctl.store import load

ROOT = Path(__file__).resolve().parents[2]


def test_example_plan_matches_its_profile_and_the_planner():
    profile = load(ROOT / "profiles/example-tiny.json", Profile)
    plan = load(ROOT / "plans/example-tiny.yaml", HppPlan)
    check_plan_matches(plan, profile)
    fresh = make_plan(profile, PlanRequest(global_batch=64, micro_batch=16), plan.strategy)
    assert fresh.stages == plan.stages, (
        "plans/example-tiny.yaml is stale; regenerate with: hppctl plan --profile profiles/example-tiny.json "
        "--global-batch 64 --micro-batch 16 --out plans/example-tiny.yaml")
