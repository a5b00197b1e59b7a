"""Exact per-helper schedules on slots: largest tail first (Theorem 2, Algorithm 2). Pure.

With the assignment fixed, each helper's backward problem P_b^i is 1 | r_j, pmtn | max(C_j + q_j):
jobs with release dates R_j = φ^f_j + l_j + l′_j, work p′_j and tail q_j = r′_j (the client's work
after the helper), preemptible at slot boundaries, on the slots the forward schedule left free.
The paper solves it with Lawler's block algorithm (Algorithm 2); the preemptive
"largest tail first" rule (Jackson/Horn: in every free slot run the released job with the
largest tail) gives an optimal schedule too and is what hppctl uses. Both are here;
tests check they agree and reproduce the paper's Fig. 4 (makespan 14).

The forward correction step (Eq. 19: minimise max_j c^f_j on a helper for the final assignment)
is the same problem with tail l_j, so `largest_tail_first` solves it exactly as well.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from hppctl.planner.psl.instance import B, F, Instance, Timeline, slot_pieces, task_code

FREE = -1


def largest_tail_first(owner: np.ndarray, jobs: Sequence[int], release: Sequence[int], work: Sequence[int],
                       tail: Sequence[float], code: Sequence[int],
                       tie: Sequence[float] | None = None) -> tuple[np.ndarray, dict[int, int]]:
    """Fill the FREE slots of `owner` preemptively, largest tail first; returns (owner, finish slot per job).

    `owner[t]` is FREE or the code of the task holding slot t; the array grows as needed.
    Ties go to the larger `tie` value, then the earlier release, then the lower job index.
    """
    order = sorted(range(len(jobs)), key=lambda k: (release[k], k))
    left = [int(w) for w in work]
    finish: dict[int, int] = {}
    ready: list[tuple[float, float, int, int]] = []
    nxt, t = 0, 0
    while len(finish) < len(jobs):
        while nxt < len(order) and release[order[nxt]] <= t:
            k = order[nxt]
            heapq.heappush(ready, (-float(tail[k]), -float(tie[k]) if tie is not None else 0.0, release[k], k))
            nxt += 1
        if not ready:
            t = max(t, int(release[order[nxt]]))
            continue
        if t >= len(owner):
            owner = np.concatenate([owner, np.full(max(len(owner), 16), FREE, dtype=owner.dtype)])
        if owner[t] == FREE:
            k = ready[0][3]
            owner[t] = code[k]
            left[k] -= 1
            if left[k] == 0:
                heapq.heappop(ready)
                finish[jobs[k]] = t + 1
        t += 1
    return owner, finish


def forward_schedule(instance: Instance, helper: int, clients: Sequence[int], horizon: int) -> tuple[np.ndarray, dict[int, int]]:
    """Eq. (19) on one helper: F tasks released at r, minimising max(φ^f + l); exact.

    Ties (equal l) go to the client with more work left after its forward (l′ + p′ + r′), which
    does not change the forward optimum but helps the backward step that follows.
    """
    i, js = helper, list(clients)
    owner = np.full(max(horizon, 1), FREE, dtype=np.int64)
    return largest_tail_first(
        owner, js, [int(instance.r[i, j]) for j in js], [int(instance.p[i, j]) for j in js],
        [float(instance.l[i, j]) for j in js], [task_code(F, j) for j in js],
        tie=[float(instance.lp[i, j] + instance.pp[i, j] + instance.rp[i, j]) for j in js])


def backward_schedule(instance: Instance, helper: int, owner: np.ndarray,
                      forward_done: dict[int, int]) -> tuple[np.ndarray, dict[int, int]]:
    """P_b^i: B tasks released at φ^f + l + l′, largest r′ first, in the slots `owner` left free."""
    i, js = helper, list(forward_done)
    return largest_tail_first(
        owner, js, [int(forward_done[j] + instance.l[i, j] + instance.lp[i, j]) for j in js],
        [int(instance.pp[i, j]) for j in js], [float(instance.rp[i, j]) for j in js], [task_code(B, j) for j in js])


def decomposed_timeline(instance: Instance, assignment: np.ndarray,
                        forward: dict[int, tuple[np.ndarray, dict[int, int]]] | None = None) -> Timeline:
    """Slot timeline for an assignment: the given (or exact) forward schedule, then the exact backward one."""
    J = instance.num_clients
    f_done, b_done = np.zeros(J), np.zeros(J)
    pieces = []
    horizon = int(np.ceil(instance.forward_horizon())) + 1
    for i in range(instance.num_helpers):
        mine = [int(j) for j in np.flatnonzero(assignment == i)]
        owner, fwd = forward[i] if forward is not None else forward_schedule(instance, i, mine, horizon)
        owner, bwd = backward_schedule(instance, i, owner.copy(), fwd)
        work = {(F, j): int(instance.p[i, j]) for j in mine} | {(B, j): int(instance.pp[i, j]) for j in mine}
        pieces.append(slot_pieces(owner, work))
        for j in mine:
            f_done[j], b_done[j] = fwd[j], bwd[j]
    return Timeline(np.asarray(assignment), pieces, f_done, b_done).finish(instance)


# ---------------------------------------------------------------------------------------------
# The paper's Algorithm 2 (Lawler's blocks), kept as the reference the tests check LTF against
# ---------------------------------------------------------------------------------------------


def fcfs_on_slots(jobs: Sequence[int], release: dict[int, int], work: dict[int, int],
                  free: Sequence[int]) -> dict[int, list[int]]:
    """Jobs in release order, each taking the next `work` free slots at or after its release."""
    slots: dict[int, list[int]] = {}
    pos = 0
    for j in sorted(jobs, key=lambda j: (release[j], j)):
        while free[pos] < release[j]:
            pos += 1
        slots[j] = list(free[pos:pos + work[j]])
        pos += work[j]
    return slots


def blocks(slots: dict[int, list[int]], free: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Split an FCFS schedule into blocks: maximal runs of jobs with no idle free slot between them.

    Returns (jobs in FCFS order, the free slots the block spans)."""
    index = {s: k for k, s in enumerate(free)}
    out: list[tuple[list[int], list[int]]] = []
    for j in sorted(slots, key=lambda j: index[slots[j][0]]):
        first, last = index[slots[j][0]], index[slots[j][-1]]
        if out and first == index[out[-1][1][-1]] + 1:
            out[-1][0].append(j)
            out[-1][1].extend(free[index[out[-1][1][-1]] + 1:last + 1])
        else:
            out.append(([j], list(free[first:last + 1])))
    return out


def algorithm2(release: dict[int, int], work: dict[int, int], tail: dict[int, float],
               free: Sequence[int]) -> tuple[dict[int, list[int]], list[dict]]:
    """Lawler's algorithm as the paper's Algorithm 2 describes it; returns (slots per job, trace).

    For each block β (s(β), e(β)): ℓ = argmin_{j∈β} e(β) + tail_j (Eq. 26) runs only in the
    slots of β the other jobs leave idle; the others are rescheduled FCFS and split into
    sub-blocks, which are solved the same way. `trace` records every block and its ℓ.
    """
    trace: list[dict] = []
    result: dict[int, list[int]] = {}

    def solve(members: list[int], span: list[int], depth: int) -> None:
        end = span[-1] + 1
        ell = min(members, key=lambda j: (end + tail[j], -release[j], j))
        trace.append({"depth": depth, "jobs": list(members), "s": min(release[j] for j in members), "e": end, "l": ell})
        rest = [j for j in members if j != ell]
        sub = fcfs_on_slots(rest, release, work, span) if rest else {}
        used = {s for v in sub.values() for s in v}
        result[ell] = [s for s in span if s not in used]
        for sub_members, sub_span in blocks(sub, span):
            solve(sub_members, sub_span, depth + 1)

    first = fcfs_on_slots(list(release), release, work, free)
    for members, span in blocks(first, free):
        solve(members, span, 0)
    return result, trace
