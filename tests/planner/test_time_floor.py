"""The head floor the DP prunes by (`GroupAllocator.time_floor`): never above Algorithm 1's answer, and the
pruned DP's answer still the full DP's, on profiles whose times are not a fixed cost plus a per-sample one.

The synthetic profiles of the other planner tests are affine in the batch size, where the floor's lines are
exact; these tests use `wobbly.wobbly_profile`, every measured point scaled by its own random factor."""

import random

import numpy as np
import pytest

from hppctl.models.plan import PlanRequest
from hppctl.planner import cost_model
from hppctl.planner.vector_alloc import GroupAllocator, tables_for
from hppctl.profiling.synthetic import synthetic_profile
from tests.planner.wobbly import assert_the_pruned_dp_gives_the_full_dps_answer, wobbly_profile


@pytest.mark.parametrize("seed", range(40))
def test_the_floor_is_never_above_algorithm_1s_answer(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    cm = cost_model(wobbly_profile(rng, rng.randint(2, 14), n),
                    PlanRequest(global_batch=600, micro_batch=rng.choice([1, 3, 24, 60, 100])))
    tables, L = tables_for(cm), cm.num_layers
    start, end = (x.astype(np.int64) for x in np.triu_indices(L + 1, k=1))
    for _ in range(4):
        a = rng.randrange(n)
        devices = rng.sample(range(n), rng.randint(1, n - a))
        alloc = GroupAllocator(tables, devices, start, end)
        cols = np.arange(len(start))
        floor = alloc.time_floor(cols)
        assert np.all(np.isfinite(floor) | np.isposinf(floor))
        for warmup in (1, 3, 9):
            answer = alloc.for_warmup(warmup, cols)
            step = answer.forward_s + answer.backward_s
            ran = answer.feasible
            assert np.all(floor[ran] <= step[ran] * (1 + 1e-12)), (devices, warmup)


def test_the_floor_is_the_answer_on_even_devices_with_affine_times():
    """Four equal devices, a fixed cost plus a per-sample one: 64 samples split 16 each, and the floor is that
    split's time (the per-sample rate alone gave 18 / 24 of it)."""
    cm = cost_model(synthetic_profile(30, [1.0] * 4, grid=[1, 2, 4, 8, 16, 32, 64]),
                    PlanRequest(global_batch=256, micro_batch=64))
    start, end = (x.astype(np.int64) for x in np.triu_indices(31, k=1))
    alloc = GroupAllocator(tables_for(cm), [0, 1, 2, 3], start, end)
    cols = np.arange(len(start))
    answer = alloc.for_warmup(1, cols)
    np.testing.assert_allclose(alloc.time_floor(cols), answer.forward_s + answer.backward_s, rtol=1e-9)
    assert np.all(alloc.balanced_lower_bound(tables_for(cm).min_rate_prefix, cols)
                  < 0.8 * (answer.forward_s + answer.backward_s))


@pytest.mark.parametrize("seed", range(16))
def test_the_pruned_dp_equals_the_full_dp_on_wobbly_profiles(seed):
    rng = random.Random(700 + seed)
    cm = cost_model(wobbly_profile(rng, rng.randint(5, 30), rng.randint(2, 6)),
                    PlanRequest(global_batch=512, micro_batch=rng.choice([8, 16, 64])))
    assert_the_pruned_dp_gives_the_full_dps_answer(cm)
