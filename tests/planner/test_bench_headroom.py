"""bench/pipeline_headroom.py's bounds are upper bounds: no plan the planner makes replays faster.

The compute bound and the link bound claim that no plan of the family they relax (docs/benchmarks.md,
"How far any plan can go") trains faster on a profile. Checked on random small synthetic profiles,
with links that bind (large activations and parameters on slow uplinks) and links that do not: every
plan asteroid, pp and dp make, replayed by the simulator, stays at or under the link bound's proven
figure, which stays at or under the compute bound; the plan HiGHS found stays under what it proved.
"""

from __future__ import annotations

import random

import pytest

from hppctl.errors import Infeasible
from hppctl.models.plan import PlanRequest
from hppctl.planner import make_plan
from hppctl.profiling.synthetic import synthetic_profile
from hppctl.schedule import simulate_plan
from tests.bench_modules import load_bench

TOLERANCE = 1 + 1e-6  # the solver's feasibility tolerance


@pytest.fixture(scope="module")
def headroom():
    return load_bench("pipeline_headroom")


def random_profile(seed: int):
    rng = random.Random(seed)
    devices = rng.randint(2, 4)
    return synthetic_profile(rng.randint(4, 9), [rng.choice([0.5, 1.0, 2.0, 3.0]) for _ in range(devices)], seed=seed,
                             bandwidth_bytes_per_s=rng.choice([1e6, 12.5e6, 125e6]),
                             param_scale=rng.choice([1.0, 10.0, 100.0]), activation_scale=rng.choice([1.0, 8.0]))


@pytest.mark.parametrize("seed", range(16))
def test_no_plan_replays_faster_than_the_bounds(headroom, seed):
    profile = random_profile(seed)
    global_batch, micro_batch = 64, random.Random(seed).choice([8, 16, 32])
    costs = headroom.per_sample_costs(profile, micro_batch)
    compute = headroom.compute_bound(costs, global_batch)
    found, proven = headroom.link_bound(profile, costs, global_batch, node_limit=200)
    assert found is not None and proven is not None
    assert found <= proven * TOLERANCE
    assert proven <= compute * TOLERANCE
    replayed = 0
    for strategy in ("asteroid", "pp", "dp"):
        try:
            plan = make_plan(profile, PlanRequest(global_batch=global_batch, micro_batch=micro_batch), strategy)
        except Infeasible:
            continue
        replayed += 1
        simulated = global_batch / simulate_plan(plan, profile)[1].round_latency_s
        assert simulated <= proven * TOLERANCE, (strategy, simulated, proven)
    assert replayed > 0


def test_slow_links_bring_the_link_bound_under_the_compute_bound(headroom):
    """The link bound is not the compute bound under another name: on a profile whose activations
    and parameters cannot cross a slow link in the compute bound's time, it is lower."""
    profile = synthetic_profile(6, [1.0, 1.0, 1.0], seed=3, bandwidth_bytes_per_s=1e5, param_scale=10.0,
                                activation_scale=8.0)
    costs = headroom.per_sample_costs(profile, 16)
    _, proven = headroom.link_bound(profile, costs, 64, node_limit=200)
    assert proven < 0.9 * headroom.compute_bound(costs, 64)


@pytest.mark.parametrize("seed,bandwidth", [(0, 1e6), (0, 3e6), (4, 3e6)])
def test_a_pipeline_on_a_slow_link_stays_under_the_link_bound(headroom, seed, bandwidth):
    """Where the activations crossing the cut bind (two hosts, parameters too large to replicate, 32
    micro-batches), pp's replay comes close to the link bound: a bound that charged the cut more
    than the simulator does would fall below it."""
    profile = synthetic_profile(8, [1.0, 1.0], seed=seed, bandwidth_bytes_per_s=bandwidth, param_scale=100.0)
    costs = headroom.per_sample_costs(profile, 8)
    _, proven = headroom.link_bound(profile, costs, 256, node_limit=200)
    plan = make_plan(profile, PlanRequest(global_batch=256, micro_batch=8), "pp")
    simulated = 256 / simulate_plan(plan, profile)[1].round_latency_s
    assert len(plan.stages) == 2
    assert simulated <= proven * TOLERANCE
    assert simulated >= 0.5 * proven  # the instance is one where the cut binds, not a vacuous one
