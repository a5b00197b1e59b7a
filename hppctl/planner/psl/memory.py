"""Helper memory (Eq. 5): each helper holds one part-2 copy per assigned client."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hppctl.errors import Infeasible
from hppctl.models.units import format_bytes
from hppctl.planner.psl.instance import Instance


def check_memory(instance: Instance, clients: Sequence[str], helpers: Sequence[str]) -> None:
    """`Infeasible` when a client fits no helper or all clients together exceed all helpers.

    Both are necessary conditions only: whether an assignment exists is bin packing, which the
    exact and admm methods decide (their assignment step is an integer program) and the greedy
    methods may miss (they then raise `Infeasible` naming the client they could not place).
    """
    biggest = int(instance.capacity.max())
    for j, need in enumerate(instance.demand):
        if need > biggest:
            raise Infeasible(f"client {clients[j]!r} needs {format_bytes(int(need))} on its helper; the largest "
                             f"helper budget is {format_bytes(biggest)} ({helpers[int(instance.capacity.argmax())]})")
    total, room = int(instance.demand.sum()), int(instance.capacity.sum())
    if total > room:
        raise Infeasible(f"the {len(clients)} clients need {format_bytes(total)} of helper memory together; "
                         f"the {len(helpers)} helpers have {format_bytes(room)}")


def used_memory(instance: Instance, assignment: np.ndarray) -> np.ndarray:
    """Bytes each helper holds under `assignment`."""
    used = np.zeros(instance.num_helpers, dtype=np.int64)
    np.add.at(used, assignment, instance.demand)
    return used
