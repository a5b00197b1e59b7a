"""Algorithm 2 of the Asteroid paper: dynamic programming over (last layers, last devices, stages).

Devices are sorted by memory (descending; ties: faster first, then name) and every stage's
group is a contiguous run of that order, the head stage taking the first devices. State
Q(i, n, p): the best pipeline of p stages covering layers [i, L) on the last n devices. A
p-stage pipeline is a new head stage [i, j) on devices [N-n, N-n') (K = 2p-1 forwards in
flight, Algorithm 1 for its split) plus a communication step plus the stored best
(p-1)-stage pipeline Q(j, n', p-1) — the paper keeps one best plan per state, so this is a
heuristic, not an exact optimiser (notes §3.5).

Each stored sub-pipeline is summarised by two numbers so that prepending is O(1) (this is
Eq. 11's incremental dominant step, in closed form):
  A = max_s [M (E_f+E_b)_s + sum_{i<s} (E_f+E_b)_i]     (the head's execution end, C)
  Z = max_s [T_a^s - sum_{i<s} E_b^i]                    (AllReduce slack; T_a^s the exposed
                                                          part, `cost.exposed_allreduce`)
  latency = A + Z                                        (Eq. 4)
All (i, j) candidates of one (p, n, n') are evaluated at once with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hppctl.planner.cost import CostModel, StageChoice
from hppctl.planner import progress
from hppctl.planner.forked import forked_map, worth_forking
from hppctl.planner.vector_alloc import GroupAllocator, first_minima, tables_for


def memory_order(cm: CostModel) -> list[int]:
    """The paper's device order: memory descending; ties broken by speed (notes §3.5), then name."""
    speed = [cm.forward_time(d, 0, cm.num_layers, cm.B) + cm.backward_time(d, 0, cm.num_layers, cm.B)
             for d in range(len(cm.names))]
    return sorted(range(len(cm.names)), key=lambda d: (-cm.budget[d], speed[d], cm.names[d]))


def speed_order(cm: CostModel) -> list[int]:
    """Fastest device first (an alternative order `asteroid` also tries)."""
    speed = [cm.forward_time(d, 0, cm.num_layers, cm.B) + cm.backward_time(d, 0, cm.num_layers, cm.B)
             for d in range(len(cm.names))]
    return sorted(range(len(cm.names)), key=lambda d: (speed[d], -cm.budget[d], cm.names[d]))


@dataclass
class _Table:
    """Q(., n, p) for every start layer i: latency, A, Z, head group size, back-pointers."""

    latency: np.ndarray
    a: np.ndarray
    z: np.ndarray
    head_size: np.ndarray
    next_layer: np.ndarray
    next_devices: np.ndarray


@dataclass(frozen=True)
class DpResult:
    stages: list[StageChoice]
    latency: float


@dataclass
class _RowBests:
    """One batch of head candidates for Q(., n, p) from sub-pipelines of n_sub devices, reduced to each
    row's first lowest latency (`vector_alloc.first_minima`): all a table takes from a batch, and what a forked
    half sends back."""

    p: int
    n_sub: int
    rows: np.ndarray
    latency: np.ndarray
    a: np.ndarray
    z: np.ndarray
    next_layer: np.ndarray
    head_size: int


class AsteroidDP:
    """Runs Algorithm 2 once for one device order; `best(...)` reads plans off the tables.

    `bound`: a round latency the caller knows the answer does not exceed. Candidates whose
    cheap lower bound (see `_prepend_head`) is above it skip Algorithm 1. Prepending a head
    never shortens a pipeline (latency_new >= latency_sub + E_f^head + E^comm), so every
    candidate on the path to an answer <= bound survives and the result is identical to the
    unbounded DP's; `solve` re-runs without the bound if the answer turns out to exceed it.
    States no plan can read are skipped too (`_useful_heads`).
    """

    def __init__(self, cm: CostModel, order: list[int], bound: float = np.inf, *, parallel: bool | None = None):
        """`parallel`: split the head groups with a forked child (None: when the DP is large and the
        process may use two CPUs; the tables are identical either way)."""
        self.cm, self.order, self.bound = cm, order, bound
        self.tables = tables_for(cm)
        self.L, self.N = cm.num_layers, len(order)
        self.max_stages = min(self.L, self.N)
        i, j = np.triu_indices(self.L, k=1)
        self._pairs_head = np.stack([i, j], axis=1).astype(np.int64)
        self._head_start, self._head_end = self._pairs_head[:, 0].copy(), self._pairs_head[:, 1].copy()
        # position of head pair (i, j) in the pair list (for reading a chosen stage back)
        self._pair_index = np.full((self.L, self.L), -1, dtype=np.int64)
        self._pair_index[i, j] = np.arange(len(self._pairs_head))
        self._allocators: dict[tuple[int, int, bool], GroupAllocator] = {}
        self._inverse_rates: dict[int, np.ndarray] = {}
        self._heads_by_state: dict[tuple[int, int], int] = {}
        # first pair index of each row i (pairs are ordered by i, then j); entry L: the number of pairs
        self._row_start = np.r_[0, np.cumsum(np.arange(self.L - 1, -1, -1))]
        self._min_bw = self._cross_bandwidth()
        self.q: dict[tuple[int, int], _Table] = {}
        self._parallel = worth_forking(len(self._pairs_head)) if parallel is None else parallel
        self._run()

    # -- helpers ---------------------------------------------------------------------------
    def _group(self, a: int, b: int) -> list[int]:
        """Profile indices of sorted positions [a, b)."""
        return self.order[a:b]

    def _allocator(self, a: int, b: int, tail: bool) -> GroupAllocator:
        """Algorithm 1 on group [a, b) for all tail ranges [i, L) or all head ranges [i, j<L)."""
        key = (a, b, tail)
        if key not in self._allocators:
            if tail:
                start = np.arange(self.L, dtype=np.int64)
                end = np.full(self.L, self.L, dtype=np.int64)
            else:
                start, end = self._head_start, self._head_end  # shared: read only, per-pair sums cached
            self._allocators[key] = GroupAllocator(self.tables, self._group(a, b), start, end)
        return self._allocators[key]

    def _cross_bandwidth(self) -> np.ndarray:
        """mb[a, b, c] = slowest link between sorted groups [a, b) and [b, c)."""
        n = self.N
        bw = np.array([[self.cm.bw[self.order[x]][self.order[y]] for y in range(n)] for x in range(n)])
        mb = np.full((n + 1, n + 1, n + 1), np.inf)
        for a in range(n):
            for b in range(a + 1, n):
                for c in range(b + 1, n + 1):
                    mb[a, b, c] = bw[a:b, b:c].min()
        return mb

    def _empty(self) -> _Table:
        L = self.L
        return _Table(np.full(L + 1, np.inf), np.full(L + 1, np.inf), np.full(L + 1, np.inf),
                      np.zeros(L + 1, dtype=np.int64), np.full(L + 1, -1), np.full(L + 1, -1))

    # -- the dynamic program ---------------------------------------------------------------
    def _run(self) -> None:
        # Q(., n, p) needs Q(., n', p - 1) for n' < n only, so the device count can be the outer
        # loop; then each head group [N-n, N-n') is visited once, for every p, and freed after.
        for n in range(1, self.N + 1):
            progress.step(f"devices {n}/{self.N}")
            self.q[(n, 1)] = self._single_stage(n)
            for p in range(2, min(n, self.L) + 1):
                self.q[(n, p)] = self._empty()
            if self._parallel and n >= 3:
                self._prepend_heads_in_two(n)
                continue
            tables = {p: self.q[(n, p)] for p in range(2, min(n, self.L) + 1)}
            for n_sub in range(1, n):
                self._prepend_heads(n, n_sub, tables)

    def _prepend_heads(self, n: int, n_sub: int, tables: dict[int, _Table]) -> list[_RowBests]:
        """Every p's heads on devices [N-n, N-n_sub) before Q(., n_sub, p-1), offered to `tables[p]`
        (Q(., n, p): a head is tried only if it may beat the row's best there); each batch's row
        bests, applied to it, are returned too."""
        alloc = self._allocator(self.N - n, self.N - n_sub, tail=False)
        floor, found = None, []
        for p in range(2, min(n_sub + 1, self.L) + 1):
            floor, bests = self._prepend_head(n, n_sub, p, alloc, floor, tables[p])
            if bests is not None:
                self._apply_row_bests(tables[p], bests)
                found.append(bests)
        self._allocators.pop((self.N - n, self.N - n_sub, False), None)
        return found

    # -- two processes ---------------------------------------------------------------------
    def _prepend_heads_in_two(self, n: int) -> None:
        """Q(., n, p >= 2) from the head groups n_sub = 1, 3, 5, … here and 2, 4, … in a forked child
        (`forked.forked_map`), each side's batches reduced to row bests (`_RowBests`) and applied in
        the one-process order (n_sub, then p), so the tables are the one-process DP's bit for bit.
        Each side tries a head against its own rows' bests, which are never better than the
        one-process run's at that point (they come from a subset of the earlier batches): it tries a
        superset of heads, and a head the one-process run would not try has a latency above that
        run's row best (its lower bound is), so it is never kept."""
        for found in forked_map(lambda: self._side_of(n), range(1, n)):
            for bests in found:
                self._apply_row_bests(self.q[(n, bests.p)], bests)

    def _side_of(self, n: int):
        """One side's work for device count n: n_sub -> that head group's row bests, against the
        side's own fresh Q(., n, p) tables."""
        local = {p: self._empty() for p in range(2, min(n, self.L) + 1)}
        return lambda n_sub: self._prepend_heads(n, n_sub, local)

    def _single_stage(self, n: int) -> _Table:
        """Q(i, n, 1): layers [i, L) data-parallel on the last n devices, K = 1 (pure DP)."""
        cm, L = self.cm, self.L
        alloc = self._allocator(self.N - n, self.N, tail=True)
        res = alloc.for_warmup(min(1, cm.M))
        busy = cm.M * (res.forward_s + res.backward_s)
        exposed = alloc.exposed(np.arange(L), res.backward_s)
        latency = np.where(res.feasible, busy + exposed, np.inf)
        none = np.full(L + 1, -1)
        pad = lambda x, fill: np.append(x, fill)  # noqa: E731 — index L means "no layers left"
        return _Table(pad(latency, np.inf), pad(busy, np.inf), pad(exposed, np.inf),
                      pad(np.full(L, n), 0), none, none)

    def _prepend_head(self, n: int, n_sub: int, p: int, alloc: GroupAllocator, floor,
                      out: _Table) -> tuple[tuple | None, _RowBests | None]:
        """Every head [i, j) on devices [N-n, N-n_sub) before Q(j, n_sub, p-1) that may beat `out`
        (Q(., n, p)) is tried; returns `floor` and the batch's row bests (None: no head was tried).

        `floor` carries what depends on the head group only, computed at its first p: each head's
        lower bound on its pipeline's latency and the heads that bound alone does not prune.
        """
        cm, N = self.cm, self.N
        sub = self.q[(n_sub, p - 1)]
        i_all, j_all = self._pairs_head[:, 0], self._pairs_head[:, 1]
        # per cut position j (1-D), then gathered per pair: the sub-pipeline and the transfer into it
        j_line = np.arange(1, self.L)
        bw = self._min_bw[N - n, N - n_sub, np.minimum(N - n_sub + sub.head_size[j_line], N)]
        comm_line = np.zeros(self.L)
        comm_line[1:] = cm.B * self.tables.boundary[j_line - 1] / bw
        heads = self._useful_heads(n, p)
        if np.isfinite(self.bound):
            if floor is None:  # at the group's first p, whose rows are a superset of the later ones'
                floor = self._group_floor(n, n_sub, alloc)
            last = np.searchsorted(floor[0], self._useful_heads(n, p))
            cols, i, j, head_floor, once = (x[:last] for x in floor)
            # lower bounds on the new pipeline's latency A + Z (see the formulas below; E_f + E_b
            # of the head >= its balanced bound h, M (E_f + E_b) + Z >= M h + X(h): `_group_floor`):
            #   the sub-pipeline's own latency plus the transfer (prepending never shortens);
            #   A >= the sub-pipeline's A (or the transfer's M micro-batches) plus one head micro-batch
            tail_line = sub.latency[:self.L] + comm_line
            a_line = np.maximum(sub.a[:self.L] + 2 * comm_line, cm.M * 2 * comm_line)
            lower = _pipeline_floor(head_floor, once, tail_line, a_line, j)
            # a head whose lower bound exceeds the bound, or the best latency row i already has
            # (kept only when strictly better), cannot change the table
            cols = cols[(lower <= self.bound) & (lower <= out.latency[i])]
            # the same bounds with each remaining head's own floor (`GroupAllocator.time_floor`, tighter
            # where devices pay a fixed cost per micro-batch), before Algorithm 1 runs on it
            lower = _pipeline_floor(*self._head_floors(alloc, cols, alloc.time_floor(cols)), tail_line, a_line, j_all[cols])
            cols = cols[(lower <= self.bound) & (lower <= out.latency[i_all[cols]])]
        else:
            cols = np.flatnonzero(np.isfinite(sub.latency[j_all[:heads]]))
        if cols.size == 0:
            return floor, None
        res = alloc.for_warmup(min(2 * p - 1, cm.M), cols)
        j, c = j_all[cols], comm_line[j_all[cols]]
        head = res.forward_s + res.backward_s
        a = np.maximum(np.maximum(cm.M * head, cm.M * 2 * c + head), sub.a[j] + head + 2 * c)
        z = np.maximum(np.maximum(alloc.exposed(cols, res.backward_s), -res.backward_s), sub.z[j] - res.backward_s - c)
        latency = np.where(res.feasible, a + z, np.inf)
        i = i_all[cols]
        pick = first_minima(latency, i)
        return floor, _RowBests(p, n_sub, i[pick], latency[pick], a[pick], z[pick], j[pick], n - n_sub)

    def _group_floor(self, n: int, n_sub: int, alloc: GroupAllocator) -> tuple:
        """What the bounds of `_prepend_head` need of a head group for every p: the heads [i, j) whose
        lower bound at their lowest over every p is within the bound (positions in the pair list, i, j),
        each one's M h + X(h) and h + X(h) (h its balanced bound on E_f + E_b, X the exposed AllReduce).

        The head adds M H + X(E_b) to A + Z, H = E_f + E_b >= h. X falls as E_b grows, but never faster
        than (1 - 1/n) E_b: as E_b <= H, M H + X(E_b) >= M H + X(H), which rises with H (M >= 1), so it
        is >= M h + X(h); likewise H + X(H) >= h + X(h). (X >= T_a / n alone pruned too little: the
        1000 x 16 plan took 1.3x longer after the overlap came in.) Heads whose sub-pipelines are all
        above the bound are dropped first, before h is computed.
        """
        i_all, j_all = self._pairs_head[:, 0], self._pairs_head[:, 1]
        heads = self._useful_heads(n, 2)
        tail, a_least = self._least_sub_pipelines(n_sub)
        cols = np.flatnonzero(tail[j_all[:heads]] * (1 - 1e-9) <= self.bound)
        head_floor, once = self._head_floors(alloc, cols, self._balanced_head_bound(alloc, cols))
        keep = _pipeline_floor(head_floor, once, tail, a_least, j_all[cols]) <= self.bound
        cols = cols[keep]
        return cols, i_all[cols], j_all[cols], head_floor[keep], once[keep]

    def _head_floors(self, alloc: GroupAllocator, cols: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(M h + X(h), h + X(h)) of heads `cols` whose E_f + E_b is at least h, X the exposed AllReduce as
        if the last backward took h: floors of what the head adds to A + Z and to A + X (`_group_floor`)."""
        exposed = alloc.exposed(cols, h)
        return self.cm.M * h + exposed, h + exposed

    def _least_sub_pipelines(self, n_sub: int) -> tuple[np.ndarray, np.ndarray]:
        """Per start layer, the least latency and the least A of Q(., n_sub, p) over every p: what a head
        group's p-independent bounds read (the transfer into a sub-pipeline is >= 0)."""
        subs = [self.q[(n_sub, p)] for p in range(1, min(n_sub, self.L) + 1)]
        return (np.minimum.reduce([sub.latency[:self.L] for sub in subs]),
                np.minimum.reduce([sub.a[:self.L] for sub in subs]))

    def _useful_heads(self, n: int, p: int) -> int:
        """How many head pairs (a prefix of the pair list: rows i = 0, 1, ...) can lead to a plan.

        Q(i > 0, n, p) is read only as the tail of a longer pipeline whose earlier stages run layers
        [0, i) on devices [0, N - n) (sorted positions): none is left when n = N, so there only
        i = 0 counts. Otherwise those stages hold, summed over their devices, at least the
        weights of [0, i) and K >= min(2p + 1, M) micro-batches of B samples of its activations
        (Eq. 3, each device within its budget, so within the budgets' sum; a 1e-9 margin for
        rounding); rows past the last i that passes cannot be on any plan.
        """
        if n == self.N:
            return self.L - 1
        key = (n, p)
        if key not in self._heads_by_state:
            cm, t = self.cm, self.tables
            room = sum(cm.budget[d] for d in self.order[:self.N - n]) * (1 + 1e-9) + self.N
            need = cm.fixed_factor * t.param[:self.L] + min(2 * p + 1, cm.M) * cm.B * t.act[:self.L]
            rows = max(1, int(np.searchsorted(need, room, side="right")))  # rows 0 .. rows-1 pass
            rows = min(rows, self._rows_in_time(n))
            self._heads_by_state[key] = int(self._row_start[rows])
        return self._heads_by_state[key]

    def _rows_in_time(self, n: int) -> int:
        """Rows i whose layers [0, i) the m = N - n devices before them could run within the bound.

        Every stage s of those layers takes, per micro-batch, at least B / sum_{d in D} 1/rho_d(s)
        (`balanced_lower_bound` over all of D), and the round at least M times that (A >= M (E_f +
        E_b)_s). That bound is superadditive over layers, and at most m stages share [0, i), so the
        largest is at least 1/m of the per-layer bounds' sum: M B H(i) / m <= bound, else row i and
        everything after it is pruned (1e-9 margin, as the heads' own bound).
        """
        if not np.isfinite(self.bound):
            return self.L
        devices = self.order[:self.N - n]
        rates = np.diff(self.tables.min_rate_prefix[devices], axis=1)  # (m, L): cheapest per-sample cost
        with np.errstate(divide="ignore"):
            per_layer = 1.0 / np.where(rates > 0, 1.0 / rates, np.inf).sum(axis=0)
        total = np.r_[0.0, np.cumsum(per_layer)][:self.L] * (self.cm.M * self.cm.B / len(devices))
        return max(1, int(np.searchsorted(total * (1 - 1e-9), self.bound, side="right")))

    def _balanced_head_bound(self, alloc: GroupAllocator, cols: np.ndarray) -> np.ndarray:
        """`GroupAllocator.balanced_lower_bound` of head pairs `cols`, from each device's 1/rho over every
        head pair, computed once per device (the same sum, in the same order)."""
        inverse = np.zeros(cols.size)
        for d in alloc.devices:
            if d not in self._inverse_rates:
                rate = self.tables.min_rate_prefix[d, self._pairs_head[:, 1]] - self.tables.min_rate_prefix[d, self._pairs_head[:, 0]]
                with np.errstate(divide="ignore"):
                    self._inverse_rates[d] = np.where(rate > 0, 1.0 / rate, np.inf)
            inverse += self._inverse_rates[d][cols]
        with np.errstate(divide="ignore"):
            return self.cm.B / inverse

    @staticmethod
    def _apply_row_bests(out: _Table, bests: _RowBests) -> None:
        """For each start layer i the batch's best candidate j (lowest latency, first j on ties)
        replaces the table's if it is strictly better than the row's best so far."""
        better = bests.latency < out.latency[bests.rows]
        if not better.any():
            return
        rows = bests.rows[better]
        out.latency[rows] = bests.latency[better]
        out.a[rows], out.z[rows] = bests.a[better], bests.z[better]
        out.head_size[rows] = bests.head_size
        out.next_layer[rows] = bests.next_layer[better]
        out.next_devices[rows] = bests.n_sub

    # -- reading plans off the tables ------------------------------------------------------
    def best(self, *, devices: int | None = None) -> DpResult | None:
        """min over p of Q(0, N, p) (the paper); with `devices=None` also over n <= N (drop devices)."""
        choices = [(n, p) for (n, p) in self.q if devices is None or n == devices]
        n, p = min(choices, key=lambda k: (self.q[k].latency[0], k[1], -k[0]))
        if not np.isfinite(self.q[(n, p)].latency[0]):
            return None
        return DpResult(self._trace(n, p), float(self.q[(n, p)].latency[0]))

    def _trace(self, n: int, p: int) -> list[StageChoice]:
        stages, i = [], 0
        while True:
            table = self.q[(n, p)]
            if p == 1:
                stages.append(self._stage(i, self.L, self.N - n, self.N, 1))
                return stages
            j, n_sub = int(table.next_layer[i]), int(table.next_devices[i])
            stages.append(self._stage(i, j, self.N - n, self.N - n_sub, min(2 * p - 1, self.cm.M)))
            i, n, p = j, n_sub, p - 1

    def _stage(self, i: int, j: int, a: int, b: int, warmup: int) -> StageChoice:
        alloc = self._allocator(a, b, tail=(j == self.L))
        col = i if j == self.L else int(self._pair_index[i, j])
        samples = alloc.for_warmup(warmup, np.array([col]), with_samples=True).samples[:, 0]
        return StageChoice(i, j, tuple(self._group(a, b)), tuple(int(y) for y in samples))


def solve(cm: CostModel, order: list[int], bound: float = np.inf) -> tuple[AsteroidDP, DpResult | None]:
    """The paper's DP with pruning by `bound`; falls back to the unbounded DP if the bound was too tight."""
    dp = AsteroidDP(cm, order, bound)
    result = dp.best(devices=len(order))
    if np.isfinite(bound) and (result is None or result.latency > bound * (1 + 1e-9)):
        dp = AsteroidDP(cm, order)
        result = dp.best(devices=len(order))
    return dp, result


def _pipeline_floor(head_floor: np.ndarray, once: np.ndarray, tail: np.ndarray, a: np.ndarray, j: np.ndarray) -> np.ndarray:
    """A lower bound on A + Z of heads before the sub-pipelines at layers `j` (a 1e-9 margin for
    rounding): the head's own floor, the sub-pipeline's latency (`tail`, with the transfer; prepending
    never shortens), and its A (`a`) plus one head micro-batch (`once`)."""
    return np.maximum(np.maximum(head_floor, tail[j]), a[j] + once) * (1 - 1e-9)
