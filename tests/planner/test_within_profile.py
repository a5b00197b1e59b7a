"""Planning within the profile's batch sizes (`CostModel.ceiling`, used by `--micro-batch auto`).

A device measured up to 128 samples gets at most 128 per micro-batch: Algorithm 1 treats that ceiling as it
treats a memory cap. Before, auto planned without it and dropped any candidate whose plan gave a device one
sample past its grid (dp at B = 256 on two near-identical hosts: 129/127), so it chose a worse micro-batch.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from hppctl.models.plan import PlanRequest
from hppctl.planner import cost_model, make_plan
from hppctl.planner.allocation import allocate
from hppctl.planner.asteroid import AsteroidDP, memory_order
from hppctl.planner.cost import CostModel
from hppctl.planner.exhaustive import best_plan
from hppctl.planner.micro_batch import make_auto_plan
from hppctl.planner.vector_alloc import GroupAllocator, LayerTables
from hppctl.profiling.synthetic import synthetic_profile
from tests.conftest import make_profile


def measured_up_to(profile, largest: list[int]):
    """`profile` with device d's measurements cut at batch size largest[d] (a profile of smaller devices)."""
    devices = []
    for device, top in zip(profile.devices, largest):
        keep = [i for i, b in enumerate(device.batch_sizes) if b <= top]
        devices.append(device.model_copy(update={
            "batch_sizes": [device.batch_sizes[i] for i in keep],
            "forward_s": [[row[i] for i in keep] for row in device.forward_s],
            "backward_s": [[row[i] for i in keep] for row in device.backward_s]}))
    return profile.model_copy(update={"devices": devices})


def test_dp_with_one_micro_batch_splits_within_the_grid_instead_of_losing_the_candidate():
    # two hosts 5 % apart, both measured up to 128: dp's best plan is one micro-batch of 256 per round;
    # Algorithm 1 alone gives the faster host 131, past its grid, and auto used to skip B = 256 for that
    profile = make_profile(layers=6, speeds=(1.0, 1.05), grid=[1, 2, 4, 8, 16, 32, 64, 128])
    unconstrained = make_plan(profile, PlanRequest(global_batch=256, micro_batch=256), "dp")
    assert max(unconstrained.stages[0].samples) > 128  # the case: without the ceiling one host is past its grid
    plan = make_auto_plan(profile, 256, "dp")
    assert plan.micro_batch == 256 and plan.num_micro_batches == 1
    assert sorted(plan.stages[0].samples) == [128, 128]
    chosen = next(c for c in plan.micro_batch_choice.candidates if c.micro_batch == 256)
    assert chosen.skipped is None


def ceiling_instance(seed: int):
    """One stage on 2-5 devices, each measured up to its own batch size, some memory-capped too."""
    rng = random.Random(seed)
    g, layers = rng.randint(2, 5), rng.randint(1, 4)
    micro_batch, warmup = rng.choice([24, 32, 64, 96]), rng.choice([1, 3])
    memory = [rng.choice([2 * 10**6, 8 * 10**6, 4 * 10**9]) for _ in range(g)]
    base = synthetic_profile(layers, [rng.uniform(0.3, 3) for _ in range(g)], seed=seed, memory_bytes=memory)
    profile = measured_up_to(base, [rng.choice([4, 8, 16, 32, 64, 256]) for _ in range(g)])
    cm = CostModel(profile, micro_batch=micro_batch, num_micro_batches=8, within_profile=True)
    devices = list(range(g))
    rng.shuffle(devices)
    return cm, devices, warmup, layers


def test_the_dp_shortcut_equals_scalar_algorithm1_under_ceilings():
    # GroupAllocator (vectorised, with its "uncapped run stands" shortcut) against allocate(), sample for sample
    differ, capped = [], 0
    for seed in range(300):
        cm, devices, warmup, layers = ceiling_instance(seed)
        got = GroupAllocator(LayerTables(cm), devices, np.array([0]), np.array([layers])).for_warmup(
            warmup, with_samples=True)
        mine = [int(y) for y in got.samples[:, 0]] if got.feasible[0] else None
        expected = allocate(cm, devices, 0, layers, warmup)
        if mine != expected:
            differ.append((seed, mine, expected))
        if expected is not None:
            assert all(y <= cm.ceiling[d] for d, y in zip(devices, expected))
            capped += any(y == cm.ceiling[d] < cm.B for d, y in zip(devices, expected))
    assert not differ
    assert capped > 30  # the generator does exercise binding ceilings


@pytest.mark.parametrize("seed", range(16))
def test_asteroid_stays_within_the_ceilings_and_exhaustive_search_bounds_it(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 3)
    base = make_profile(layers=rng.randint(2, 5), speeds=[rng.uniform(0.3, 3) for _ in range(n)], seed=seed)
    profile = measured_up_to(base, [rng.choice([1, 2, 4, 8]) for _ in range(n)])
    request = PlanRequest(global_batch=6 * rng.choice([1, 2]), micro_batch=6)
    cm = cost_model(profile, request, within_profile=True)
    optimum, stages = best_plan(cm)
    dp = AsteroidDP(cm, memory_order(cm)).best(devices=len(cm.names))
    if stages is None:
        assert dp is None  # no split keeps every device within its grid
        return
    assert all(y <= cm.ceiling[d] for s in stages for d, y in zip(s.devices, s.samples))
    if dp is not None:
        assert all(y <= cm.ceiling[d] for s in dp.stages for d, y in zip(s.devices, s.samples))
        assert cm.evaluate(dp.stages).round_latency_s >= optimum * (1 - 1e-9)


def test_without_the_ceiling_nothing_changes():
    # the default (every explicit --micro-batch) plans as before: the ceiling is B for every device
    profile = measured_up_to(make_profile(layers=5, speeds=(1, 2, 3)), [4, 8, 256])
    cm = cost_model(profile, PlanRequest(global_batch=64, micro_batch=32))
    assert cm.ceiling == [32, 32, 32] and not cm.within_profile
    assert cost_model(profile, PlanRequest(global_batch=64, micro_batch=32), within_profile=True).ceiling == [4, 8, 32]
