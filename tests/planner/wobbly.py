"""Shared by the planner tests: profiles whose times are not affine in the batch, and the pruned-DP check."""

import random

from hppctl.planner.asteroid import AsteroidDP, memory_order, solve
from hppctl.planner.strategies.asteroid import in_space_bound
from hppctl.profiling.synthetic import synthetic_profile

GRIDS = [[1, 2, 4, 8, 16, 32, 64], [2, 3, 8, 24], [1, 4, 16], [4, 8, 64, 128], [3], [1, 5, 6, 7, 40]]


def wobbly_profile(rng: random.Random, layers: int, devices: int):
    """A synthetic profile on a random grid with each (layer, batch) time scaled by 0.2-1.8 on its own:
    measured profiles wobble (a batch of 2 faster than 1, concave curves, grids that start above 1 or
    stop below the micro-batch), where the synthetic ones are a fixed cost plus a per-sample one."""
    grid = rng.choice(GRIDS)
    profile = synthetic_profile(layers, [rng.uniform(0.3, 3) for _ in range(devices)], seed=rng.randrange(1000),
                                memory_bytes=[int(rng.choice([0.05, 0.5, 4]) * 10**9) for _ in range(devices)],
                                grid=grid, activation_scale=rng.choice([1, 30]), param_scale=rng.choice([1, 30]))
    wobbled = []
    for device in profile.devices:
        scale = lambda rows: [[t * rng.uniform(0.2, 1.8) for t in row] for row in rows]  # noqa: E731
        wobbled.append(device.model_copy(update={"forward_s": scale(device.forward_s),
                                                 "backward_s": scale(device.backward_s)}))
    return profile.model_copy(update={"devices": wobbled})


def assert_the_pruned_dp_gives_the_full_dps_answer(cm) -> None:
    """`solve` with `in_space_bound`'s pruning: the unpruned DP's latency and stages, or nothing as it."""
    order = memory_order(cm)
    full = AsteroidDP(cm, order).best(devices=len(order))
    _, pruned = solve(cm, order, in_space_bound(cm, order))
    assert (full is None) == (pruned is None)
    if full:
        assert pruned.latency == full.latency and pruned.stages == full.stages
