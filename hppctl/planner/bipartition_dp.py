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
    # With equal cuts there is no backward cut to search for: BSA degenerates to the exact DP.
    bsa = search == "bsa" and not c.options.equal_cuts
    for w in range(W):
        link = _link_table(c, w)
        last = w == W - 1
        new = np.full((L + 1, L + 1), np.inf)
        for j1 in [L] if last else range(L + 1):
            j2s = np.array([L]) if last else np.arange(L + 1)
            if c.options.equal_cuts:
                j2s = j2s[j2s == j1]
            step = _bsa_row if bsa else _exact_row
            new[j1, j2s], back[w, j1, j2s] = step(c, w, D, link, j1, j2s)
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


def _uplink_forward(c: BiCosts, w: int, j1: int, j2):
    """Seconds of what worker w sends forward to w+1 when w+1 starts at (j1, j2) (uplink model;
    `j2` may be an array)."""
    if not c.options.uplink or w + 1 >= c.W:
        return 0.0
    return forward_bytes(c, j1, j2) / c.bandwidth[w, w + 1]


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


def _window(c: BiCosts, j1: int, j2):
    """The largest start cuts (i1, i2) a worker ending at (j1, j2) may have (`j2` may be an array).
    Interleaved cuts (see the module docstring) unless the options ask for the paper's whole space,
    which is exact only without split traffic (every term is then local to one worker or one
    neighbour link)."""
    return (np.minimum(j1, j2),) * 2 if c.options.interleaved_only else (j1, j2)


def _exact_row(c: BiCosts, w: int, D: np.ndarray, link: np.ndarray, j1: int,
               j2s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The best (i1, i2) for worker w ending at (j1, j2), for every j2 of `j2s` at once: one
    (j2, i1, i2) grid instead of a numpy pass per target (the DP's time was those passes' overhead).
    Ties go to the first (i1, i2) in row-major order, as a per-target grid would give them."""
    n = D.shape[0]
    j2 = j2s[:, None, None]
    i1, i2 = np.arange(n)[None, :, None], np.arange(n)[None, None, :]
    k1, k2 = _window(c, j1, j2)
    values = _candidates(c, w, D, link, j1, j2, i1, i2)
    values = np.where((i1 > k1) | (i2 > k2), np.inf, values)
    flat = values.reshape(len(j2s), n * n)
    best = flat.argmin(axis=1)
    return flat[np.arange(len(j2s)), best], np.stack([best // n, best % n], axis=1)


def _bsa_row(c: BiCosts, w: int, D: np.ndarray, link: np.ndarray, j1: int,
             j2s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 2 for every i1 and every j2 of `j2s` at once: binary search on i2 in [0, k] where D stops
    being <= T. Rows are (j2, i1); an i1 beyond the target's window takes no part."""
    n = D.shape[0]
    j2 = j2s[:, None]
    i1 = np.arange(n)[None, :]
    k1, k2 = _window(c, j1, j2)
    rows = i1 <= k1
    # Search where the sub-pipeline exists (D finite): the paper's D is finite everywhere, ours is
    # not (interleaving, memory), and a search through infinities would only find the edge.
    finite = np.isfinite(D)[None, :, :] & (np.arange(n)[None, None, :] <= k2[:, :, None])
    some = finite.any(axis=2)
    first = finite.argmax(axis=2)
    last = np.where(some, n - 1 - finite[:, :, ::-1].argmax(axis=2), k2)
    lo, hi = first.astype(np.int64), np.where(rows, last, first).astype(np.int64)
    # Invariant: the crossing lies in [lo, hi]. Floor-mid with lo = mid + 1 terminates (notes §7.2).
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        left = D[i1, mid]
        right = worker_time(c, w, i1, j1, mid, j2)
        active, go_right = lo < hi, left <= right
        lo, hi = np.where(active & go_right, mid + 1, lo), np.where(active & ~go_right, mid, hi)
    # The crossing's two neighbours, compared on the full objective; the second replaces the first
    # only when strictly better (each row's first minimum over i1, as in a per-target search).
    found = []
    for i2 in (lo - 1, lo):
        i2 = np.clip(i2, first, last)
        values = np.where(rows, _candidates(c, w, D, link, j1, j2, i1, i2), np.inf)
        a = values.argmin(axis=1)
        at = np.arange(len(j2s))
        found.append((values[at, a], a, i2[at, a]))
    (v1, a1, b1), (v2, a2, b2) = found
    second, first_ok = v2 < v1, np.isfinite(v1)
    value = np.where(second, v2, np.where(first_ok, v1, np.inf))
    arg = np.where(second[:, None], np.stack([a2, b2], axis=1),
                   np.where(first_ok[:, None], np.stack([a1, b1], axis=1), 0))
    return value, arg


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
