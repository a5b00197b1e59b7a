"""Algorithm 1: scalar reference vs vectorised twin, memory caps, offloading."""

import random

import numpy as np
import pytest

from hppctl.planner.allocation import allocate, integerize
from hppctl.planner.cost import CostModel
from hppctl.planner.vector_alloc import LayerTables, allocate_many
from tests.conftest import make_profile


def test_integerize_gives_remainder_to_largest_fractions():
    assert integerize([1.5, 2.7, 3.8], 8) == [1, 3, 4]
    assert sum(integerize([10 / 3] * 3, 10)) == 10


def test_faster_device_gets_more_samples():
    cm = CostModel(make_profile(layers=4, speeds=(1.0, 3.0)), micro_batch=64, num_micro_batches=4)
    y = allocate(cm, [0, 1], 0, 4, 1)
    assert sum(y) == 64 and y[1] > 2 * y[0]


def test_memory_cap_is_respected_and_rest_goes_elsewhere():
    # dev1 is fast but tiny: it gets only what fits, dev0 takes the rest
    profile = make_profile(layers=4, speeds=(1.0, 5.0), memory_gb=(8, 0.05), activation_scale=10)
    cm = CostModel(profile, micro_batch=64, num_micro_batches=4)
    cap = cm.max_samples(1, 0, 4, 3)
    assert 0 < cap < 32
    y = allocate(cm, [0, 1], 0, 4, 3)
    assert y[1] <= cap and sum(y) == 64
    assert cm.memory(0, 4, y[1], 3) <= cm.budget[1]


def test_group_that_cannot_hold_the_weights_is_infeasible():
    profile = make_profile(layers=4, speeds=(1.0, 1.0), memory_gb=(8, 1e-6), param_scale=100)
    cm = CostModel(profile, micro_batch=8, num_micro_batches=2)
    assert allocate(cm, [0, 1], 0, 4, 1) is None


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_algorithm1_equals_reference(seed):
    rng = random.Random(seed)
    n, layers = rng.randint(1, 5), rng.randint(1, 10)
    profile = make_profile(layers=layers, speeds=[rng.uniform(0.3, 3) for _ in range(n)],
                           memory_gb=[rng.choice([0.2, 0.4, 0.8]) for _ in range(n)], seed=seed,
                           activation_scale=rng.choice([1, 10, 50]), grid=[1, 4, 16, 64])
    cm = CostModel(profile, micro_batch=rng.choice([4, 8, 16, 48, 100]), num_micro_batches=4)
    tables = LayerTables(cm)
    start, end = np.triu_indices(layers + 1, k=1)
    for warmup in (1, 3, 7):
        caps = tables.caps(np.arange(n), start, end, warmup)
        got = allocate_many(tables, list(range(n)), start, end, caps)
        for col, (i, j) in enumerate(zip(start, end)):
            expected = allocate(cm, list(range(n)), int(i), int(j), warmup)
            assert (list(got.samples[:, col]) if got.feasible[col] else None) == expected


@pytest.mark.parametrize("micro_batch,block", [(1, 1), (31, 1), (32, 1), (63, 1), (64, 2), (100, 3), (255, 7)])
def test_offloading_block_is_one_32nd_of_b_rounded_down(micro_batch, block):
    # issue 24 item 7: the paper leaves the block size tunable (notes §3.4, no value); ours is
    # max(1, floor(B / 32)) and docs/planner.md must say the same (it said ceil(B / 32))
    from pathlib import Path

    from hppctl.planner.allocation import block_size

    assert block_size(micro_batch) == block
    docs = (Path(__file__).resolve().parents[2] / "docs/planner.md").read_text()
    assert "blocks of max(1, ⌊B/32⌋) samples" in docs and "⌈B/32⌉" not in docs
