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
    code, stdout, _ = cli("plan", "--profile", profile, "--global-batch", 64, "--micro-batch", 32, "--strategy", "pp",
                          "--explain")
    assert code == 0 and "if run asynchronously (hppctl run --schedule nf1b, TiMePReSt)" in stdout
    code, stdout, _ = cli("plan", "--profile", profile, "--global-batch", 64, "--micro-batch", 32, "--strategy", "pp",
                          "--explain", "--json")
    doc = json.loads(stdout)
    stages = len(doc["plan"]["stages"])
    assert doc["timeprest"]["W"] == stages and doc["timeprest"]["N"] == 2
    assert (doc["timeprest"]["simulated"] == 1) == (stages <= 3)


def test_many_micro_batches_take_eq_11_instead_of_a_simulation(monkeypatch):
    """Issue 23, item 8: the report simulated W x (2W + 6) x N actions, 62 s and 2.8 GB of `hppctl plan`'s
    table for N = 10000; only N <= 16 (checked against eq. 11) or N < W - 1 (v > 1 possible) simulate."""
    from hppctl.schedule import async_version

    simulated = []
    real = async_version.simulated_version_difference
    monkeypatch.setattr(async_version, "simulated_version_difference",
                        lambda W, N, **kw: simulated.append((W, N)) or real(W, N, **kw))
    report = plan_version_report(3, 10000)
    assert simulated == [] and report["simulated"] is None and report["paper_formula"] == 1
    assert report["advice"].startswith("v = 1: a single update sequence")
    assert plan_version_report(3, 16)["simulated"] == 1 and plan_version_report(6, 2)["simulated"] == 2
    assert simulated == [(3, 16), (6, 2)]


def test_plan_table_for_10000_micro_batches_runs_no_nf1b_simulation(cli, tmp_path, monkeypatch):
    from hppctl.schedule import async_version

    def refuse(*args, **kw):
        raise AssertionError("the nf1b report simulated a 10000-micro-batch window")

    monkeypatch.setattr(async_version, "simulated_version_difference", refuse)
    profile = tmp_path / "p.json"
    save(profile, make_profile(layers=12, speeds=(1, 1, 1), memory_gb=(4, 4, 4)))
    code, stdout, err = cli("plan", "--profile", profile, "--global-batch", 10000, "--micro-batch", 1,
                            "--strategy", "pp", "--explain")
    assert code == 0, err
    assert "10000 micro-batches per mini-batch" in stdout and "version difference v = 1 by eq. 11" in stdout
