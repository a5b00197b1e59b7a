"""`pp`'s min-max partition (one device per stage) against a plain dynamic program over every layer range.

The planner's version first solves with cuts only every few layers and then keeps only the ranges no
slower than that answer (`strategies.pp._partition_over`); the reference below tries every range with
the cost model's scalar times and memory check, first start on ties: the same cuts and value."""

import random

import pytest

from hppctl.models.plan import PlanRequest
from hppctl.planner import cost_model
from hppctl.planner.cost import asteroid_warmup
from hppctl.planner.strategies.pp import balanced_partition
from tests.planner.wobbly import wobbly_profile


def reference_partition(cm, devices):
    L, P = cm.num_layers, len(devices)
    if P > L:
        return None
    inf = float("inf")
    best = [0.0] + [inf] * L
    back = []
    for p, d in enumerate(devices):
        warmup = asteroid_warmup(P, p, cm.M)
        new, pointer = [inf] * (L + 1), [0] * (L + 1)
        for j in range(1, L + 1):
            for i in range(j):
                fits = cm.ceiling[d] >= cm.B and cm.max_samples(d, i, j, warmup) >= cm.B
                cost = cm.forward_time(d, i, j, cm.B) + cm.backward_time(d, i, j, cm.B) if fits else inf
                cand = max(best[i], cost)
                if cand < new[j] or (i == 0 and cand == new[j]):
                    new[j], pointer[j] = cand, i
        best = new
        back.append(pointer)
    if best[L] == inf:
        return None
    cuts, j = [L], L
    for p in range(P - 1, -1, -1):
        j = back[p][j]
        cuts.append(j)
    return cuts[::-1], best[L]


@pytest.mark.parametrize("seed", range(12))
def test_the_partition_is_the_plain_dynamic_programs(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    layers = rng.choice([3, 20, 150, 200])  # the last two cut every 2-3 layers in the bounding pass
    cm = cost_model(wobbly_profile(rng, layers, n), PlanRequest(global_batch=512, micro_batch=rng.choice([8, 16, 64])))
    devices = rng.sample(range(n), rng.randint(1, n))
    expected = reference_partition(cm, devices)
    found = balanced_partition(cm, devices)
    if expected is None:
        assert found is None
        return
    cuts, value = expected
    assert [s.start for s in found] + [found[-1].end] == cuts
    assert max(cm.forward_time(s.devices[0], s.start, s.end, cm.B) + cm.backward_time(s.devices[0], s.start, s.end, cm.B)
               for s in found) == value

