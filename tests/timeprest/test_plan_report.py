"""`hppctl plan` reports the version difference of a plan run under nf1b, and the N that gives v = 1."""

import json

from hppctl.schedule.async_version import plan_version_report
from hppctl.store import save
from tests.conftest import make_profile


def test_report_recommends_n_at_least_w_minus_one():
    report = plan_version_report(4, 2)
    assert (report["simulated"], report["paper_formula"], report["recommended_min_micro_batches"]) == (2, 2, 3)
    assert "use N >= 3" in report["advice"]
    assert plan_version_report(4, 3)["simulated"] == 1
    assert plan_version_report(1, 8) is None


def test_report_names_the_minimum_for_unmicrobatched_plans():
    assert plan_version_report(5, 1)["recommended_min_micro_batches"] == 4


def test_plan_cli_prints_and_explains_v(cli, tmp_path):
    profile = tmp_path / "p.json"
    save(profile, make_profile(layers=12, speeds=(1, 1, 1, 1), memory_gb=(4, 4, 4, 4)))
    code, stdout, _ = cli("plan", "--profile", profile, "--global-batch", 64, "--micro-batch", 32, "--strategy", "pp")
    assert code == 0 and "under nf1b (TiMePReSt" in stdout
    code, stdout, _ = cli("plan", "--profile", profile, "--global-batch", 64, "--micro-batch", 32, "--strategy", "pp",
                          "--explain", "--json")
    doc = json.loads(stdout)
    stages = len(doc["plan"]["stages"])
    assert doc["timeprest"]["W"] == stages and doc["timeprest"]["N"] == 2
    assert (doc["timeprest"]["simulated"] == 1) == (stages <= 3)
