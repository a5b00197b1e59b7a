"""The paper's baseline ("naive real-time PSL"): random memory-feasible assignment + FCFS. Pure.

Each client in index order goes to a helper drawn uniformly from those with enough free memory.
The draw is seeded, so a plan is reproducible; a draw that strands a client is retried.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hppctl.errors import Infeasible
from hppctl.planner.psl.fcfs import fcfs_timeline
from hppctl.planner.psl.instance import Instance, Timeline

ATTEMPTS = 100


def random_assignment(instance: Instance, clients: Sequence[str], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    for _ in range(ATTEMPTS):
        free = instance.capacity.astype(np.int64).copy()
        assignment = np.empty(instance.num_clients, dtype=np.int64)
        for j, need in enumerate(instance.demand):
            fits = np.flatnonzero(free >= need)
            if len(fits) == 0:
                break
            i = int(rng.choice(fits))
            assignment[j] = i
            free[i] -= need
        else:
            return assignment
    raise Infeasible(f"random-fcfs: {ATTEMPTS} random draws all left a client without helper memory "
                     f"({len(clients)} clients); --method exact or admm decide memory exactly")


def random_fcfs(instance: Instance, clients: Sequence[str], seed: int = 0) -> Timeline:
    return fcfs_timeline(instance, random_assignment(instance, clients, seed))
