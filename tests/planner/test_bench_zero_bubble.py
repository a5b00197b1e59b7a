"""bench/zero_bubble_estimate.py's replay: with no weight-gradient split it is hppctl's simulator (for plans
with one device per stage), and with a split it still does every stage's whole work."""

from __future__ import annotations

import random

import pytest

from hppctl.models.plan import PlanRequest
from hppctl.planner import make_plan
from hppctl.profiling.synthetic import synthetic_profile
from hppctl.schedule import simulate_plan
from tests.bench_modules import load_bench


@pytest.fixture(scope="module")
def zb():
    return load_bench("zero_bubble_estimate")


def chain_plan(seed: int):
    """A pp plan (one device per stage) of 2-5 stages on a random synthetic profile."""
    rng = random.Random(seed)
    speeds = [rng.choice([0.5, 1.0, 2.0, 3.0]) for _ in range(rng.randint(2, 5))]
    profile = synthetic_profile(rng.randint(6, 14), speeds, seed=seed,
                                bandwidth_bytes_per_s=rng.choice([1e6, 12.5e6, 125e6]),
                                activation_scale=rng.choice([1.0, 8.0]))
    plan = make_plan(profile, PlanRequest(global_batch=64, micro_batch=rng.choice([4, 8, 16])), "pp")
    return profile, plan


@pytest.mark.parametrize("seed", range(20))
def test_without_a_split_the_replay_is_the_simulator(zb, seed):
    profile, plan = chain_plan(seed)
    simulated = 64 / simulate_plan(plan, profile)[1].round_latency_s
    assert zb.replay(plan, profile, [0.0] * len(plan.stages)) == pytest.approx(simulated, rel=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_with_a_split_every_stage_still_does_all_its_work(zb, seed):
    """Deferred weight gradients are run, not dropped: the round is at least the busiest stage's compute."""
    profile, plan = chain_plan(seed)
    chain = zb.Chain(plan, profile)
    shares = [random.Random(seed + s).uniform(0.1, 0.9) for s in range(len(plan.stages))]
    busiest = max(plan.num_micro_batches * (f + b) for f, b in zip(chain.forward, chain.backward))
    assert zb.replay(plan, profile, shares) <= 64 / busiest * (1 + 1e-9)
