"""Bi-Partition's search: an exact prefix DP, the paper's binary search, and an exhaustive search.

The paper's DP (Eqs. 2–3, Alg. 1) splits A(i1, j1, i2, j2, m) into two sub-pipelines; notes §3.6
suggests the cheaper prefix form. State after the first m workers: D[m][j1][j2] = least bottleneck
with their forwards covering [0, j1) and their backwards [0, j2). Worker m takes F [j1, j1') and
B [j2, j2'):

    D[m+1][j1'][j2'] = min over (j1, j2) of max(D[m][j1][j2], link_m(j1, j2), T_m(j1, j1', j2, j2'))

with infeasible memory pruned (Alg. 1 lines 8–9, with the comparison the right way round, notes
§7.1). Cuts must interleave, max(f_w, b_w) <= min(f_{w+1}, b_{w+1}): every split layer then lies
between neighbouring workers, so its traffic loads exactly the link the transition already prices
and the DP is exact over that space (tests compare with `exhaustive`). Splits across non-neighbours
are left out (their traffic would need the whole cut history in the state); `exhaustive(...,
interleaved_only=False)` measures what that costs on small instances. Without split traffic every
term is local, and `BiOptions(interleave=False)` (the paper's model, `BiOptions.paper()`) searches
the whole Eq. 1 space exactly; the runtime executes interleaved plans only.

`search="bsa"` is the paper's Alg. 2: for each (j1', j2', j1) the backward cut j2 is found by
binary search on the crossing of D (non-decreasing in j2) and T (non-increasing), then the better
of the two neighbours is kept. It ignores the link term in the search (notes §7.3), so it can miss
the optimum; `bench/bipartition_search.py` reports the gap.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from hppctl.planner.bipartition import BiCosts, BiResult, backward_bytes, evaluate, forward_bytes, interleaved, \
    link_bytes, valid_cuts, worker_memory, worker_time


def solve(c: BiCosts, search: str = "exact") -> BiResult | None:
    """Least-bottleneck interleaved cuts for all W workers of `c` (None if nothing fits memory)."""
    if search not in ("exact", "bsa"):
        raise ValueError(f"search must be 'exact' or 'bsa', got {search!r}")
    L, W = c.L, c.W
    D = np.full((L + 1, L + 1), np.inf)
    D[0, 0] = 0.0
    back = np.zeros((W, L + 1, L + 1, 2), dtype=np.int64)
    for w in range(W):
        link = _link_table(c, w)
        last = w == W - 1
        new = np.full((L + 1, L + 1), np.inf)
        targets = [(L, L)] if last else [(j1, j2) for j1 in range(L + 1) for j2 in range(L + 1)]
        for j1, j2 in targets:
            if c.options.equal_cuts and j1 != j2:
                continue
            # Interleaved cuts (see the module docstring) unless the options ask for the paper's whole
            # space, which is exact only without split traffic (every term is then local to one
            # worker or one neighbour link).
            k = (min(j1, j2),) * 2 if c.options.interleaved_only else (j1, j2)
            # With equal cuts there is no backward cut to search for: BSA degenerates to the exact DP.
            step = _bsa if search == "bsa" and not c.options.equal_cuts else _exact
            value, arg = step(c, w, D, link, j1, j2, k)
            new[j1, j2] = value
            back[w, j1, j2] = arg
        D = new
    if not np.isfinite(D[L, L]):
        return None
    forward, backward = [L], [L]
    j1, j2 = L, L
    for w in range(W - 1, -1, -1):
        j1, j2 = (int(x) for x in back[w, j1, j2])
        forward.append(j1)
        backward.append(j2)
    return evaluate(c, forward[::-1], backward[::-1])


def _link_table(c: BiCosts, w: int) -> np.ndarray:
    """link[i1, i2]: seconds per micro-batch of the traffic at worker w's start cuts (f_w, b_w) =
    (i1, i2): both directions of the pair (w-1, w) in the paper's model; with uplinks, what w sends
    back to w-1 (w's own uplink; what w-1 sends forward is added in `_uplink_forward`)."""
    L = c.L
    if w == 0:
        return np.zeros((L + 1, L + 1))
    i1, i2 = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")
    if c.options.uplink:
        return backward_bytes(c, i1, i2) / c.bandwidth[w, w - 1]
    return link_bytes(c, i1, i2) / c.bandwidth[w - 1, w]


def _uplink_forward(c: BiCosts, w: int, j1: int, j2: int) -> float:
    """Seconds of what worker w sends forward to w+1 when w+1 starts at (j1, j2) (uplink model)."""
    if not c.options.uplink or w + 1 >= c.W:
        return 0.0
    return float(forward_bytes(c, j1, j2) / c.bandwidth[w, w + 1])


def _candidates(c: BiCosts, w: int, D: np.ndarray, link: np.ndarray, j1: int, j2: int, i1, i2) -> np.ndarray:
    """The objective of every (i1, i2) candidate for worker w ending at (j1, j2); inf where invalid."""
    # With uplinks, worker w's sends are its gradients etc. back (start cuts) plus its activations
    # etc. forward (end cuts): both known in this transition, so the sum stays exact.
    up = link[i1, i2] + _uplink_forward(c, w, j1, j2)
    value = np.maximum(np.maximum(D[i1, i2], up), worker_time(c, w, i1, j1, i2, j2))
    empty = (i1 >= j1) & (i2 >= j2)
    if c.options.equal_cuts:
        empty |= i1 != i2
    over = worker_memory(c, w, i1, j1, i2, j2) > c.budget[w]
    return np.where(empty | over, np.inf, value)


def _exact(c, w, D, link, j1, j2, k) -> tuple[float, tuple[int, int]]:
    i1, i2 = np.meshgrid(np.arange(k[0] + 1), np.arange(k[1] + 1), indexing="ij")
    values = _candidates(c, w, D, link, j1, j2, i1, i2)
    a, b = np.unravel_index(int(np.argmin(values)), values.shape)
    return float(values[a, b]), (int(a), int(b))


def _bsa(c, w, D, link, j1, j2, k) -> tuple[float, tuple[int, int]]:
    """Alg. 2 for every i1 at once: binary search on i2 in [0, k] where D stops being <= T."""
    i1, k = np.arange(k[0] + 1), k[1]
    # Search where the sub-pipeline exists (D finite): the paper's D is finite everywhere, ours is
    # not (interleaving, memory), and a search through infinities would only find the edge.
    finite = np.isfinite(D[: i1.size, : k + 1])
    first, last = finite.argmax(axis=1), k - finite[:, ::-1].argmax(axis=1)
    lo, hi = first.astype(np.int64), last.astype(np.int64)
    # Invariant: the crossing lies in [lo, hi]. Floor-mid with lo = mid + 1 terminates (notes §7.2).
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        left = D[i1, mid]
        right = worker_time(c, w, i1, j1, mid, j2)
        active, go_right = lo < hi, left <= right
        lo, hi = np.where(active & go_right, mid + 1, lo), np.where(active & ~go_right, mid, hi)
    best, arg = math.inf, (0, 0)
    for i2 in (lo - 1, lo):  # the crossing's two neighbours, compared on the full objective
        i2 = np.clip(i2, first, last)
        values = _candidates(c, w, D, link, j1, j2, i1, i2)
        a = int(np.argmin(values))
        if values[a] < best:
            best, arg = float(values[a]), (int(i1[a]), int(i2[a]))
    return best, arg


def exhaustive(c: BiCosts, *, interleaved_only: bool = True) -> BiResult | None:
    """Every pair of cut sequences (small L and W only): the reference the DP is tested against."""
    L, W = c.L, c.W
    best: BiResult | None = None
    cut_sequences = [(0, *inner, L) for inner in itertools.combinations_with_replacement(range(L + 1), W - 1)]
    for forward in cut_sequences:
        for backward in cut_sequences:
            if c.options.equal_cuts and forward != backward:
                continue
            if not valid_cuts(forward, backward, L):
                continue
            if interleaved_only and c.options.interleaved_only and not interleaved(forward, backward):
                continue
            result = evaluate(c, forward, backward)
            if result.feasible and (best is None or result.bottleneck_s < best.bottleneck_s):
                best = result
    return best
