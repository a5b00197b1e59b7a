"""balanced-greedy (paper §VI): least-loaded memory-feasible assignment, then FCFS. Pure.

Clients are taken in index order; each goes to the helper with the fewest clients among those
with enough free memory for it (ties: lowest helper index), as in the released code. The load
is the NUMBER of clients, blind to helper speed — the paper notes this can lose to the random
baseline when it fills slow helpers (its (30, 5) VGG19 instance).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hppctl.errors import Infeasible
from hppctl.models.units import format_bytes
from hppctl.planner.psl.fcfs import fcfs_timeline
from hppctl.planner.psl.instance import Instance, Timeline


def balanced_assignment(instance: Instance, clients: Sequence[str]) -> np.ndarray:
    free = instance.capacity.astype(np.int64).copy()
    load = np.zeros(instance.num_helpers, dtype=np.int64)
    assignment = np.empty(instance.num_clients, dtype=np.int64)
    for j, need in enumerate(instance.demand):
        fits = np.flatnonzero(free >= need)
        if len(fits) == 0:
            raise Infeasible(f"balanced-greedy: no helper has {format_bytes(int(need))} free for client "
                             f"{clients[j]!r} (free: {', '.join(format_bytes(int(b)) for b in free)}); "
                             f"--method exact or admm decide memory exactly")
        i = int(fits[np.argmin(load[fits])])
        assignment[j] = i
        free[i] -= need
        load[i] += 1
    return assignment


def balanced_greedy(instance: Instance, clients: Sequence[str]) -> Timeline:
    return fcfs_timeline(instance, balanced_assignment(instance, clients))
