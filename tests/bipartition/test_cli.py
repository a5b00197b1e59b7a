"""`hppctl plan --strategy bipartition` writes a plan that `hppctl simulate` replays, and shows both ranges."""

from __future__ import annotations

from hppctl.models.plan import HppPlan
from hppctl.store import load, save
from tests.bipartition.test_planner import paper_profile


def test_plan_and_simulate_a_bipartition_plan(cli, tmp_path):
    profile, plan_file = tmp_path / "p.json", tmp_path / "plan.yaml"
    save(profile, paper_profile())
    code, out, _ = cli("plan", "--profile", profile, "--global-batch", 4, "--micro-batch", 1,
                       "--strategy", "bipartition-paper", "--out", plan_file)
    assert code == 0 and "[0, 1) B[0, 2)" in out
    plan = load(plan_file, HppPlan)
    assert plan.stages[0].backward_layers == [0, 2]
    code, out, _ = cli("simulate", "--plan", plan_file, "--profile", profile)
    assert code == 0 and "simulated round latency" in out
