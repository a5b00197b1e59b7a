"""Algorithm 1 of the Asteroid paper: split a micro-batch's B samples across a stage's devices.

Phase 1 (memory-aware balancing) gives each device a share proportional to its capacity
v_d = 1 / (t_f + t_b of the stage at batch B) (Eq. 9), capped by the largest batch its memory
allows; devices at their cap drop out and the rest is re-split. Phase 2 (straggler offloading)
then moves one block of samples at a time from the slowest device to the fastest one with
memory to spare, while that makes the slowest device faster.

Gaps the paper leaves (notes §3.4), resolved here and in the vectorised twin in `asteroid.py`:
- shares are fractional: floor them and give the remainder to the largest fractional parts;
- the cap is the largest y with Eq. (3) <= budget, computed once per (stage, K);
- the last offloading move, which did not help, is reverted;
- a device may end with 0 samples (the DP then effectively leaves it idle).
"""

from __future__ import annotations

import math

from hppctl.planner.cost import CostModel


# Phase 1 drops a device out once its cap is within this of its share (the vectorised twin uses it too).
DROP_OUT_TOLERANCE = 1e-9


def block_size(micro_batch: int) -> int:
    """Samples moved per offloading step: max(1, floor(B / 32)), as docs/planner.md states.

    The paper leaves the block size tunable and gives no value (notes §3.4); rounding down keeps
    the steps fine-grained for micro-batches that are not multiples of 32.
    """
    return max(1, micro_batch // 32)


def stage_time(cm: CostModel, device: int, start: int, end: int, y: int) -> float:
    return cm.forward_time(device, start, end, y) + cm.backward_time(device, start, end, y)


def memory_aware_balancing(cm: CostModel, devices: list[int], caps: list[int], start: int, end: int,
                           ) -> list[float] | None:
    """Phase 1, iteratively (same result as the paper's recursion). Returns fractional shares."""
    capacity = [1.0 / max(stage_time(cm, d, start, end, cm.B), 1e-30) for d in devices]
    y = [0.0] * len(devices)
    remaining = float(cm.B)
    active = [i for i, cap in enumerate(caps) if cap > 0]
    while remaining > 1e-9:
        if not active:
            return None
        total = sum(capacity[i] for i in active)
        given = 0.0
        for i in active:
            add = min(capacity[i] / total * remaining, caps[i] - y[i])
            y[i] += add
            given += add
        remaining -= given
        active = [i for i in active if caps[i] - y[i] > DROP_OUT_TOLERANCE]
    return y


def integerize(shares: list[float], total: int) -> list[int]:
    """Floor each share and hand the remainder to the largest fractional parts (ties: lower index)."""
    y = [int(math.floor(s + 1e-9)) for s in shares]
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - y[i]), i))
    for i in order[: total - sum(y)]:
        y[i] += 1
    return y


def straggler_offloading(cm: CostModel, devices: list[int], caps: list[int], y: list[int],
                         start: int, end: int) -> list[int]:
    """Phase 2: move blocks from the straggler to the fastest device with room, while it helps."""
    y = list(y)
    block = block_size(cm.B)
    times = [stage_time(cm, d, start, end, n) for d, n in zip(devices, y)]
    for _ in range(len(devices) * (cm.B // block + 1)):
        slow = max(range(len(devices)), key=lambda i: (times[i], -i))
        move = min(block, y[slow])
        room = [i for i in range(len(devices)) if i != slow and y[i] + move <= caps[i]]
        if move == 0 or not room:
            break
        fast = min(room, key=lambda i: (times[i], i))
        old = times[slow]
        y[slow] -= move
        y[fast] += move
        new_slow, new_fast = (stage_time(cm, devices[slow], start, end, y[slow]),
                              stage_time(cm, devices[fast], start, end, y[fast]))
        if max(new_slow, new_fast, *(t for i, t in enumerate(times) if i not in (slow, fast))) < old:
            times[slow], times[fast] = new_slow, new_fast
            continue
        y[slow] += move  # the move made things worse: undo it and stop
        y[fast] -= move
        break
    return y


def allocate(cm: CostModel, devices: list[int], start: int, end: int, warmup: int) -> list[int] | None:
    """Algorithm 1. None when the group cannot hold B samples of layers [start, end) (T = infinity)."""
    caps = [cm.max_samples(d, start, end, warmup) for d in devices]
    if min(caps) < 0:  # a device of the group cannot even hold the stage's weights
        return None
    shares = memory_aware_balancing(cm, devices, caps, start, end)
    if shares is None:
        return None
    y = integerize(shares, cm.B)
    return straggler_offloading(cm, devices, caps, y, start, end)
