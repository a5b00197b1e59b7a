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
    assert code == 0 and "0, backward 0-1" in out
    plan = load(plan_file, HppPlan)
    assert plan.stages[0].backward_layers == [0, 2]
    code, out, _ = cli("simulate", "--plan", plan_file, "--profile", profile)
    assert code == 0 and "simulated round latency" in out


def test_explain_reads_a_bipartition_plan_s_own_figures(cli, tmp_path):
    profile = tmp_path / "p.json"
    save(profile, paper_profile())
    code, out, _ = cli("plan", "--profile", profile, "--global-batch", 4, "--micro-batch", 1,
                       "--strategy", "bipartition-paper", "--explain")
    # D1 forwards layer 1 (1 s) and backwards layers 1-2 (2 + 6 s, plus 3 s re-running layer 2's
    # forward: the plan's figures are the runtime's model); Asteroid's evaluation would show 2 s
    assert code == 0 and "stage 0: layers 0, backward 0-1 on D1" in out
    row = next(line for line in out.splitlines() if "stage 0:" in line).split()
    assert row[row.index("D1") + 1:row.index("D1") + 3] == ["1.0000", "11.0000"]
