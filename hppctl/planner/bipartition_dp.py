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

`solve` minimises that bottleneck; the plans are ranked by their *round estimate* (`round_estimate`:
Asteroid's Eq. 4 on the workers' and neighbour links' times plus the weight send-back), which the
bottleneck does not determine: fill and drain count every step, not only the slowest. `solve_round`
minimises the round estimate itself. Eq. 4 with no AllReduce is C = max_s (M·e_s + Σ_{i<s} e_i)
over the steps s (worker, link, worker, ...), e_s = forward + backward time of step s, which is the
tail-first recursion G_s = e_s + max((M−1)·e_s, G_{s+1}): non-decreasing in G_{s+1}, so the least
G of every suffix (state: the start cuts of its first worker) is all the DP needs. The send-back
(the largest split-weight transfer of any link, once per round) is a max over links added to C:
the DP runs again with every link's send-back kept strictly below the last plan's, walking the
(C, send-back) Pareto front until C alone reaches the best round found (tests/bipartition/
test_round_optimal.py checks both against an exhaustive search scored by `round_estimate`).

`search="bsa"` is the paper's Alg. 2: for each (j1', j2', j1) the backward cut j2 is found by
binary search on the crossing of D (non-decreasing in j2) and T (non-increasing), then the better
of the two neighbours is kept. It ignores the link term in the search (notes §7.3), so it can miss
the optimum; `bench/bipartition_search.py` reports the gap.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from hppctl.planner import progress
from hppctl.planner.bipartition import BiCosts, BiResult, backward_bytes, evaluate, forward_bytes, interleaved, \
    link_bytes, round_estimate, send_back_at, send_back_seconds, valid_cuts, worker_memory, worker_time


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
        progress.step(f"worker {w + 1}/{W}")
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


def solve_round(c: BiCosts) -> BiResult | None:
    """Interleaved cuts (any cuts without split traffic, as `solve`) with the least round estimate
    for all W workers of `c`; None if nothing fits memory. See the module docstring."""
    steps = [_worker_steps(c, w) for w in range(c.W)]
    best, best_latency, below = None, np.inf, np.inf
    while (result := _least_fill_drain(c, steps, below)) is not None:
        latency, _ = round_estimate(c, result)
        if latency < best_latency:
            best, best_latency = result, latency
        send_back = send_back_seconds(c, result.forward, result.backward)
        # Every plan not yet seen sends back less but fills and drains no faster than this one.
        if send_back <= 0 or latency - send_back >= best_latency:
            break
        below = send_back
    return best


@functools.lru_cache(maxsize=16)
def _allowed_ranges(n: int, interleaved_only: bool, equal_cuts: bool) -> tuple[np.ndarray, ...]:
    """(i1, i2, j1, j2) of every worker range pair F [i1, j1), B [i2, j2) over n cuts that is not
    empty, not reversed, interleaved (if asked) and equal (if asked), sorted by (i1, i2, j1, j2).
    Listing only these (a sixth of the n^4 grid interleaved, n^2/2 with equal cuts) is what keeps
    the round DP as fast as the bottleneck DP. Cached: read-only."""
    if equal_cuts:
        i, j = np.nonzero(np.triu(np.ones((n, n), dtype=bool), 1))
        ranges = (i, i, j, j)
    else:
        i1, i2, j1, j2 = np.ix_(*(np.arange(n),) * 4)
        allowed = (j1 >= i1) & (j2 >= i2) & ((j1 > i1) | (j2 > i2))
        if interleaved_only:
            allowed = allowed & (np.maximum(i1, i2) <= np.minimum(j1, j2))
        ranges = np.nonzero(allowed)
    for array in ranges:
        array.flags.writeable = False
    return tuple(ranges)


def _worker_steps(c: BiCosts, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Worker w's allowed range pairs within its memory budget, as (start cut pair i1*n + i2, end cut
    pair j1*n + j2, seconds per micro-batch), sorted by start. Independent of the send-back bound,
    so computed once per solve."""
    n = c.L + 1
    i1, i2, j1, j2 = _allowed_ranges(n, c.options.interleaved_only, c.options.equal_cuts)
    fits = worker_memory(c, w, i1, j1, i2, j2) <= c.budget[w]
    i1, i2, j1, j2 = i1[fits], i2[fits], j1[fits], j2[fits]
    return i1 * n + i2, j1 * n + j2, worker_time(c, w, i1, j1, i2, j2)


def _pair_step(c: BiCosts, w: int, below: float) -> np.ndarray:
    """link[j1 * n + j2]: the transfer step between workers w and w+1 when w+1 starts at (j1, j2), as
    `round_estimate` prices it (both directions on the pair's bandwidth); inf where that link's
    weight send-back is not below `below`."""
    n = c.L + 1
    j1, j2 = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    bw = c.bandwidth[w, w + 1]
    link = forward_bytes(c, j1, j2) / bw + backward_bytes(c, j1, j2) / bw
    return np.where(send_back_at(c, w + 1, j1, j2) < below, link, np.inf)


def _step_then(e: np.ndarray, rest, M: int) -> np.ndarray:
    """G of a step taking e seconds per micro-batch followed by steps worth `rest`: e + max((M-1) e,
    rest), inf where e is (0 * inf would be NaN at M = 1, and argmin would pick it)."""
    finite = np.isfinite(e)
    e0 = np.where(finite, e, 0.0)
    return np.where(finite, e0 + np.maximum((M - 1) * e0, rest), np.inf)


def _least_fill_drain(c: BiCosts, steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                      below: float) -> BiResult | None:
    """The cuts with the least C (Eq. 4 without the send-back) among those whose every link sends
    back less than `below`, by the tail-first recursion G_s = e_s + max((M-1) e_s, G_{s+1})."""
    L, W, M = c.L, c.W, c.num_micro_batches
    n = L + 1
    # rest[j1 * n + j2]: least G of the steps after worker w, given worker w+1 starts at (j1, j2);
    # past the last worker only (L, L) is allowed, with nothing after it.
    rest = np.full(n * n, np.inf)
    rest[L * n + L] = -np.inf
    choice = np.zeros((W, n * n), dtype=np.int64)
    for w in range(W - 1, -1, -1):
        start, end, e = steps[w]
        best = np.full(n * n, np.inf)
        if len(start):
            value = _step_then(e, rest[end], M)
            first = np.flatnonzero(np.diff(start, prepend=-1))  # where each start pair's rows begin
            least = np.minimum.reduceat(value, first)
            # The first row reaching its group's least value (ties: smallest (j1, j2), as argmin).
            group = np.repeat(np.arange(len(first)), np.diff(first, append=len(start)))
            hits = np.flatnonzero(value == least[group])
            chosen = hits[np.searchsorted(hits, first)]
            best[start[first]], choice[w, start[first]] = least, end[chosen]
        if w > 0:
            rest = _step_then(_pair_step(c, w - 1, below), best, M)
    if not np.isfinite(best[0]):
        return None
    forward, backward = [0], [0]
    for w in range(W):
        j1, j2 = divmod(int(choice[w, forward[-1] * n + backward[-1]]), n)
        forward.append(j1)
        backward.append(j2)
    return evaluate(c, forward, backward)


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
