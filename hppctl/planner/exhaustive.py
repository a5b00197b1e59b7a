"""Exhaustive search under the same cost model, for small instances (tests and the gap report).

Enumerates every device order, every split of that order into contiguous groups, every
contiguous layer partition and every integer sample allocation of each stage (no device past its
`CostModel.ceiling`). Exponential:
keep L <= 6, N <= 4 and B small.
"""

from __future__ import annotations

import itertools
import math

from hppctl.planner.cost import CostModel, StageChoice


def compositions(total: int, parts: int):
    """All tuples of `parts` non-negative ints summing to `total`."""
    for cuts in itertools.combinations(range(total + parts - 1), parts - 1):
        bounds = (-1, *cuts, total + parts - 1)
        yield tuple(bounds[k + 1] - bounds[k] - 1 for k in range(parts))


def splits(n: int, parts: int):
    """Ways to cut range(n) into `parts` non-empty contiguous runs: the cut positions."""
    for cuts in itertools.combinations(range(1, n), parts - 1):
        yield (0, *cuts, n)


def best_plan(cm: CostModel, schedule: str = "1f1b-asteroid") -> tuple[float, list[StageChoice] | None]:
    L, N = cm.num_layers, len(cm.names)
    best, best_stages = math.inf, None
    for P in range(1, min(L, N) + 1):
        for order in itertools.permutations(range(N)):
            for dev_cuts in splits(N, P):
                groups = [order[dev_cuts[k]:dev_cuts[k + 1]] for k in range(P)]
                for layer_cuts in splits(L, P):
                    allocations = [[y for y in compositions(cm.B, len(g))
                                    if all(n <= cm.ceiling[d] for d, n in zip(g, y))] for g in groups]
                    for samples in itertools.product(*allocations):
                        stages = [StageChoice(layer_cuts[k], layer_cuts[k + 1], groups[k], samples[k]) for k in range(P)]
                        ev = cm.evaluate(stages, schedule)
                        if ev.feasible and ev.round_latency_s < best:
                            best, best_stages = ev.round_latency_s, stages
    return best, best_stages
