"""`hppctl plan --compare` shows the estimate and the simulated figure, and ranks by the simulated one."""

import json

import pytest

from hppctl.models.plan import PlanRequest
from hppctl.planner import compare
from hppctl.schedule import simulated_round_latency
from hppctl.store import save
from tests.conftest import make_profile


@pytest.fixture(scope="module")
def profile():
    return make_profile(layers=12, speeds=(1, 2, 3, 1), memory_gb=(4, 4, 8, 4))


def test_compare_with_a_simulator_ranks_by_simulated_throughput(profile):
    rows = compare(profile, PlanRequest(global_batch=256, micro_batch=32), simulate=simulated_round_latency(profile))
    feasible = [r for r in rows if r.feasible]
    assert all(r.simulated_round_latency_s > 0 for r in feasible)
    sims = [r.simulated_throughput for r in feasible]
    assert sims == sorted(sims, reverse=True)


def test_compare_without_a_simulator_is_unchanged(profile):
    rows = compare(profile, PlanRequest(global_batch=256, micro_batch=32))
    assert all(r.simulated_round_latency_s is None and r.simulated_throughput is None for r in rows)


def test_plan_compare_cli_shows_both_figures(cli, profile, tmp_path):
    path = tmp_path / "p.json"
    save(path, profile)
    code, out, _ = cli("plan", "--profile", path, "--global-batch", 256, "--micro-batch", 32, "--compare", "--json")
    rows = json.loads(out)
    assert code == 0 and all({"throughput", "simulated_throughput", "simulated_round_latency_s"} <= set(r) for r in rows)
    code, out, _ = cli("plan", "--profile", path, "--global-batch", 256, "--micro-batch", 32, "--compare")
    assert code == 0 and "simulated samples/s" in out and "estimate samples/s" in out
