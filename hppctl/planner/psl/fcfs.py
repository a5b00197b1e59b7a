"""First-come-first-served helper schedule (the paper's §VI step 2 and its baseline). Pure.

Each helper keeps ONE queue mixing forward and backward tasks and, whenever it is free, runs
the task that arrived first to completion (non-preemptive), as the released code does: an F
task arrives at r, the B task at (F finish) + l + l′. Ties go to the lower client index, then
F before B. Works in any unit (seconds, or slots on a quantized instance).
"""

from __future__ import annotations

import heapq

import numpy as np

from hppctl.planner.psl.instance import B, F, Instance, Piece, Timeline


def fcfs_helper(instance: Instance, helper: int, clients: list[int]) -> tuple[list[Piece], dict[int, float], dict[int, float]]:
    """One helper's FCFS run: pieces in order, F finish and B finish per client."""
    i = helper
    queue = [(float(instance.r[i, j]), j, 0) for j in clients]
    heapq.heapify(queue)
    pieces: list[Piece] = []
    f_done: dict[int, float] = {}
    b_done: dict[int, float] = {}
    now = 0.0
    while queue:
        arrival, j, kind = heapq.heappop(queue)
        start = max(now, arrival)
        if kind == 0:
            now = start + float(instance.p[i, j])
            f_done[j] = now
            heapq.heappush(queue, (now + float(instance.l[i, j] + instance.lp[i, j]), j, 1))
        else:
            now = start + float(instance.pp[i, j])
            b_done[j] = now
        pieces.append(Piece(F if kind == 0 else B, j, 1.0, start, now))
    return pieces, f_done, b_done


def fcfs_timeline(instance: Instance, assignment: np.ndarray) -> Timeline:
    """FCFS at every helper for a given assignment."""
    J = instance.num_clients
    f_done, b_done = np.zeros(J), np.zeros(J)
    pieces: list[list[Piece]] = []
    for i in range(instance.num_helpers):
        mine = [int(j) for j in np.flatnonzero(assignment == i)]
        seq, f, b = fcfs_helper(instance, i, mine)
        pieces.append(seq)
        for j in mine:
            f_done[j], b_done[j] = f[j], b[j]
    return Timeline(np.asarray(assignment), pieces, f_done, b_done).finish(instance)
