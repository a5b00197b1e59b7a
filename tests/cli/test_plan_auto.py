"""`hppctl plan --micro-batch auto` and `--compare`'s default (issue 28 item 2) on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hppctl.models.plan import HppPlan
from hppctl.store import load, save
from tests.conftest import make_profile

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "p.json"
    save(path, make_profile(layers=8, speeds=(1, 1, 2)))
    return path


def test_plan_auto_says_which_micro_batch_and_why(cli, profile_file, tmp_path):
    code, out, err = cli("plan", "--profile", profile_file, "--global-batch", 256, "--micro-batch", "auto",
                         "--strategy", "dp", "--out", tmp_path / "dp.yaml")
    assert code == 0, err
    plan = load(tmp_path / "dp.yaml", HppPlan)
    choice = plan.micro_batch_choice
    assert plan.micro_batch == choice.chosen == 256 and plan.num_micro_batches == 1
    line = next(x for x in out.splitlines() if x.startswith("micro-batch "))
    assert choice.ranked_by == "simulated"  # `hppctl plan` ranks by the simulator's replay of each candidate
    won = next(c for c in choice.candidates if c.micro_batch == 256)
    runner_up = max((c for c in choice.candidates if c.micro_batch != 256), key=lambda c: c.simulated_samples_per_s)
    assert line.startswith(f"micro-batch 256 (auto: best simulated of 1/2/4/8/16/32/64/128/256: "
                           f"{won.simulated_samples_per_s:.1f} vs "
                           f"{runner_up.simulated_samples_per_s:.1f} samples/s at {runner_up.micro_batch}")
    assert "Choosing the micro-batch" in line


def test_plan_auto_json_carries_the_choice(cli, profile_file):
    code, out, err = cli("plan", "--profile", profile_file, "--global-batch", 64, "--micro-batch", "auto", "--json")
    assert code == 0, err
    doc = json.loads(out)
    choice = doc["micro_batch_choice"]
    assert choice["chosen"] == doc["micro_batch"] and choice["rule"].startswith("divisors of the global batch")
    assert [c["micro_batch"] for c in choice["candidates"]] == [1, 2, 4, 8, 16, 32, 64]
    assert choice["ranked_by"] == "simulated"
    assert all(set(c) in ({"micro_batch", "throughput_samples_per_s", "simulated_samples_per_s"},
                          {"micro_batch", "skipped"}) for c in choice["candidates"])


def test_compare_without_micro_batch_is_auto_per_strategy(cli, profile_file):
    code, out, err = cli("plan", "--profile", profile_file, "--global-batch", 64, "--compare", "--json")
    assert code == 0, err
    rows = json.loads(out)
    for row in rows:
        assert row["micro_batch"] == row["micro_batch_choice"]["chosen"], row["strategy"]
    assert {r["strategy"]: r["micro_batch"] for r in rows}["dp"] == 64
    code, out, err = cli("plan", "--profile", profile_file, "--global-batch", 64, "--compare")
    assert code == 0, err
    assert "global batch 64, micro-batch auto (each strategy's best)" in out
    header = next(x for x in out.splitlines() if x.startswith("strategy"))
    assert "micro-batch" in header


def test_compare_with_an_explicit_micro_batch_is_as_before(cli, profile_file):
    code, out, err = cli("plan", "--profile", profile_file, "--global-batch", 64, "--micro-batch", 16, "--compare", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert {r["micro_batch"] for r in rows} == {16} and all(r["micro_batch_choice"] is None for r in rows)
    code, out, _ = cli("plan", "--profile", profile_file, "--global-batch", 64, "--micro-batch", 16, "--compare")
    assert "global batch 64 = 4 micro-batches x 16 samples" in out
    assert "micro-batch" not in next(x for x in out.splitlines() if x.startswith("strategy"))


@pytest.mark.parametrize("args, message", [
    (("--global-batch", 64, "--micro-batch", 0), "error: --micro-batch: must be a positive number of samples (got 0)"),
    (("--global-batch", 64, "--micro-batch", "foo"), "error: --micro-batch: must be a positive number of samples or auto (got 'foo')"),
    (("--global-batch", 64, "--micro-batch", "1.5"), "error: --micro-batch: must be a positive number of samples or auto (got '1.5')"),
    (("--global-batch", 0, "--micro-batch", "auto"), "error: --global-batch: must be a positive number of samples (got 0)"),
    (("--global-batch", 64, "--micro-batch", 7), "error: --micro-batch: 7 does not divide --global-batch 64"),
    (("--micro-batch", "auto"), "error: --global-batch and --micro-batch (a number or auto) are required"),
])
def test_bad_micro_batch_values_are_one_line_exit_2(cli, profile_file, args, message):
    code, out, err = cli("plan", "--profile", profile_file, *args)
    assert code == 2 and out == ""
    assert err.startswith(message) and len(err.strip().splitlines()) == 1, err


def test_auto_with_nothing_fitting_exits_3_naming_the_smallest_micro_batch(cli, tmp_path):
    path = tmp_path / "tiny.json"
    save(path, make_profile(layers=6, speeds=(1, 2), memory_gb=(0.0005, 0.0005), activation_scale=64.0))
    code, out, err = cli("plan", "--profile", path, "--global-batch", 64, "--micro-batch", "auto")
    assert code == 3 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error: no plan fits the memory budgets (global batch 64, micro-batch 1)")
    assert "--micro-batch auto tried 1/2/4/8/16/32/64" in err


@pytest.mark.parametrize("path", ["plans/example-tiny.yaml", "examples/plan-local.yaml", "examples/plan-local-dp.yaml",
                                  "examples/plan-local-pp.yaml"])
def test_plan_files_without_the_choice_load_and_save_unchanged(path, tmp_path):
    plan = load(ROOT / path, HppPlan)
    assert plan.micro_batch_choice is None
    save(tmp_path / "again.yaml", plan)
    assert "micro_batch_choice" not in (tmp_path / "again.yaml").read_text()


def test_an_edited_choice_that_is_not_the_best_is_refused(cli, profile_file, tmp_path):
    assert cli("plan", "--profile", profile_file, "--global-batch", 64, "--micro-batch", "auto", "--strategy", "dp",
               "--out", tmp_path / "p.json")[0] == 0
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["micro_batch_choice"]["candidates"][0]["simulated_samples_per_s"] = 1e12  # ranked_by: simulated
    (tmp_path / "p.json").write_text(json.dumps(doc))
    code, _, err = cli("simulate", "--plan", tmp_path / "p.json")
    assert code == 2 and "micro_batch_choice" in err and len(err.strip().splitlines()) == 1, err
