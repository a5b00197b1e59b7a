"""How the runtime runs a plan: each helper serves whole tasks in a fixed order, in seconds. Pure.

The runtime does not preempt (docs/psl.md, The runtime): a task split into pieces by an admm/exact
plan runs whole at the position of its last piece, and starts when the helper is free and its input
has arrived (F: at r; B: at F finish + l + l′). `ordered_timeline` replays exactly that on the
unrounded instance; `auto` ranks every candidate with it and predicts what it reports with it, so
the plan's makespan is the one the runtime (and `hppctl psl simulate`) replays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hppctl.planner.psl.instance import F, Instance, Piece, Timeline

Task = tuple[str, int]
"""(kind F | B, client index)."""


def completion_order(pieces: Sequence[Piece]) -> list[Task]:
    """Tasks in the order their last piece appears (each once): the order the runtime serves them."""
    last = {(pc.kind, pc.client): k for k, pc in enumerate(pieces)}
    return sorted(last, key=last.__getitem__)


def helper_run(instance: Instance, i: int, order: Sequence[Task]) -> tuple[list[Piece], dict[int, float], dict[int, float]]:
    """Helper `i` serves `order` whole and as early as possible: pieces, F finish and B finish per client."""
    now, pieces = 0.0, []
    f_done: dict[int, float] = {}
    b_done: dict[int, float] = {}
    for kind, j in order:
        if kind == F:
            start = max(now, float(instance.r[i, j]))
            now = f_done[j] = start + float(instance.p[i, j])
        else:
            start = max(now, f_done[j] + float(instance.l[i, j] + instance.lp[i, j]))
            now = b_done[j] = start + float(instance.pp[i, j])
        pieces.append(Piece(kind, j, 1.0, start, now))
    return pieces, f_done, b_done


def ordered_timeline(instance: Instance, assignment: np.ndarray, orders: Sequence[Sequence[Task]]) -> Timeline:
    """Every helper runs its order (`orders[i]`, each task of its clients once, F before B)."""
    J = instance.num_clients
    f_done, b_done = np.zeros(J), np.zeros(J)
    pieces = []
    for i, order in enumerate(orders):
        seq, f, b = helper_run(instance, i, order)
        pieces.append(seq)
        for j in f:
            f_done[j], b_done[j] = f[j], b[j]
    return Timeline(np.asarray(assignment), pieces, f_done, b_done).finish(instance)


def as_run(instance: Instance, timeline: Timeline) -> Timeline:
    """`timeline` (any unit, possibly preemptive) as the runtime runs it on `instance` (seconds)."""
    return ordered_timeline(instance, timeline.assignment, [completion_order(p) for p in timeline.pieces])


__all__ = ["Task", "as_run", "completion_order", "helper_run", "ordered_timeline"]
