"""`hppctl plan --plan FILE` re-scores (issue 24, item 8): every number recomputed from the profile,
the file's beside it where they differ, a plan over a budget infeasible (exit 3). Before, the header
and the Bi-Partition stage times were the file's own claims (99 s shown as 99 s, exit 0 over budget)."""

from __future__ import annotations

import json

import pytest

from hppctl.models.plan import HppPlan, PlanRequest
from hppctl.planner import cost_model, make_plan, strategy_names
from hppctl.planner.rescore import build_bipartition_plan
from hppctl.store import save
from tests.conftest import make_profile

REQUEST = PlanRequest(global_batch=256, micro_batch=32)


@pytest.fixture
def profile(tmp_path):
    prof = make_profile(layers=12, speeds=(1, 2, 3), memory_gb=(4, 4, 8))
    save(tmp_path / "p.json", prof)
    return prof


def edited(plan: HppPlan, edit) -> HppPlan:
    doc = plan.model_dump(mode="json")
    edit(doc)
    return HppPlan.model_validate(doc)


def bipartition_plan(profile) -> HppPlan:
    """Three workers with a split block on each inner cut (worker 0 backwards [0, 3), forwards [0, 4))."""
    cm = cost_model(profile, REQUEST)
    return build_bipartition_plan(cm, [0, 1, 2], [0, 4, 8, 12], [0, 3, 8, 12], REQUEST, "bipartition", 0.0)


def test_an_edited_prediction_is_shown_recomputed_beside_the_stored_one(cli, profile, tmp_path):
    plan = make_plan(profile, REQUEST)
    true_latency = plan.prediction.round_latency_s

    def claim_99(doc):
        doc["prediction"]["round_latency_s"] = 99.0
        doc["prediction"]["throughput_samples_per_s"] = 256 / 99.0

    save(tmp_path / "plan.yaml", edited(plan, claim_99))
    code, out, err = cli("plan", "--profile", tmp_path / "p.json", "--plan", tmp_path / "plan.yaml", "--explain")
    assert code == 0, err
    assert f"predicted round latency {true_latency:.3f} s" in out and "latency 99.000 s" not in out
    assert f"prediction.round_latency_s: stored 99 s, recomputed {true_latency:.6g} s" in out


def test_json_has_the_stored_and_the_recomputed_value(cli, profile, tmp_path):
    plan = make_plan(profile, REQUEST)
    save(tmp_path / "plan.yaml", edited(plan, lambda doc: doc["prediction"].update(round_latency_s=99.0)))
    code, out, _ = cli("plan", "--profile", tmp_path / "p.json", "--plan", tmp_path / "plan.yaml", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["plan"]["prediction"]["round_latency_s"] == pytest.approx(plan.prediction.round_latency_s)
    assert data["differences"] == [{"field": "prediction.round_latency_s", "stored": 99.0,
                                    "recomputed": plan.prediction.round_latency_s}]


def test_a_plan_over_a_budget_is_reported_and_infeasible(cli, tmp_path):
    """A foreign plan: the whole model on dev0 (20 MB budget, the model needs 29 MB), claiming it fits."""
    prof = make_profile(layers=12, speeds=(1, 2, 3), memory_gb=(0.02, 0.02, 0.04))
    save(tmp_path / "p.json", prof)
    plan = make_plan(prof, REQUEST, "pipedream")

    def everything_on_dev0(doc):
        doc["stages"] = [dict(doc["stages"][0], layers=[0, 12], devices=["dev0"], samples=[32], warmup=1,
                              memory_bytes=[1000], memory_budget_bytes=[20_000_000])]
        doc["transfers"], doc["memory_violations"] = [], []
        doc["prediction"]["peak_memory_ratio"] = 0.5

    save(tmp_path / "plan.yaml", edited(plan, everything_on_dev0))
    code, out, err = cli("plan", "--profile", tmp_path / "p.json", "--plan", tmp_path / "plan.yaml", "--explain")
    need = cost_model(prof, REQUEST).memory(0, 12, 32, 1)
    assert code == 3
    assert "memory violation: dev0 (stage 0)" in out  # the table comes first
    assert "stages.0.memory_bytes.0: stored 1000, recomputed" in out
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {tmp_path / 'plan.yaml'}: stages.0.devices.0")
    assert "device dev0" in err and "missing" in err
    assert need > 20_000_000


def test_a_bipartition_plan_with_edited_stage_times_is_recomputed(cli, profile, tmp_path):
    plan = bipartition_plan(profile)
    assert plan.stages[0].backward_layers == [0, 3]

    def slow_stage_0(doc):
        doc["stages"][0].update(forward_s=99.0, backward_s=99.0)
        doc["transfers"][0]["forward_s"] = 99.0

    save(tmp_path / "plan.yaml", edited(plan, slow_stage_0))
    code, out, _ = cli("plan", "--profile", tmp_path / "p.json", "--plan", tmp_path / "plan.yaml", "--explain", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["steps"][0]["forward_s"] == pytest.approx(plan.stages[0].forward_s)
    assert data["steps"][1]["forward_s"] == pytest.approx(plan.transfers[0].forward_s)
    stored = {d["field"]: d["stored"] for d in data["differences"]}
    assert stored == {"stages.0.forward_s": 99.0, "stages.0.backward_s": 99.0, "transfers.0.forward_s": 99.0}
    assert data["plan"]["stages"][0]["backward_layers"] == [0, 3]


@pytest.mark.parametrize("strategy", strategy_names())
def test_a_plan_as_planned_re_scores_without_differences(cli, profile, tmp_path, strategy):
    save(tmp_path / "plan.yaml", make_plan(profile, REQUEST, strategy))
    code, out, err = cli("plan", "--profile", tmp_path / "p.json", "--plan", tmp_path / "plan.yaml", "--json")
    assert code == 0, err
    assert json.loads(out)["differences"] == []


@pytest.mark.parametrize("strategy", ["asteroid", "dp"])
def test_a_plan_of_micro_batch_auto_re_scores_without_differences_and_keeps_its_choice(cli, profile, tmp_path, strategy):
    # the choice is a record of how the plan was made (like planning_time_s), not a number the profile
    # gives: re-scoring reported `micro_batch_choice: stored {...}, recomputed None`
    code, _, err = cli("plan", "--profile", tmp_path / "p.json", "--global-batch", 256, "--micro-batch", "auto",
                       "--strategy", strategy, "--out", tmp_path / "plan.yaml")
    assert code == 0, err
    code, out, err = cli("plan", "--profile", tmp_path / "p.json", "--plan", tmp_path / "plan.yaml", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["differences"] == []
    assert data["plan"]["micro_batch_choice"]["chosen"] == data["plan"]["micro_batch"]
