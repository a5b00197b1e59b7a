"""Algorithm 1 for many candidate stages at once (numpy), bit-compatible with `allocation.py`.

The DP asks for Algorithm 1 on every layer range [i, j) of every contiguous device group, for
several warm-up depths K. Three things make that affordable:
- all (i, j) pairs of one group are processed together as columns of (devices x pairs) arrays;
- converged columns leave the offloading loop (compaction), so later iterations are cheap;
- the result for K only differs from the memory-unconstrained one where some device, at any
  moment of the run, held more than that K's memory cap allows — an integer allocation that
  offloading tried, or a fractional phase-1 share (even one that rounds down to the cap: the
  capped run hands the excess to the others and can end elsewhere); only those columns are
  recomputed under the cap (`GroupAllocator.for_warmup`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hppctl.planner.allocation import DROP_OUT_TOLERANCE, block_size
from hppctl.planner.cost import ALLREDUCE_BUCKET_BYTES, CostModel


@dataclass
class Allocation:
    """Algorithm 1's answer for a set of (start, end) pairs on one group."""

    samples: np.ndarray  # (devices, pairs) int64
    forward_s: np.ndarray  # (pairs,) E_f, slowest device
    backward_s: np.ndarray  # (pairs,) E_b
    feasible: np.ndarray  # (pairs,) bool
    peak: np.ndarray  # (devices, pairs) float: the most Algorithm 1 gave each device (see `peak_demand`)


class LayerTables:
    """Numpy views of a CostModel: prefix sums per device on the shared batch grid."""

    def __init__(self, cm: CostModel):
        self.cm = cm
        self.grid = np.asarray(cm.grid, dtype=np.float64)
        self.width = cm.num_layers + 1
        fwd = np.asarray(cm._fwd, dtype=np.float64)  # (devices, grid, layers + 1)
        bwd = np.asarray(cm._bwd, dtype=np.float64)
        self.fwd3, self.bwd3 = fwd, bwd
        self.fwd, self.bwd = fwd.reshape(-1), bwd.reshape(-1)  # flat: np.take beats 3-D fancy indexing
        self.param = np.asarray(cm._param, dtype=np.float64)
        self.act = np.asarray(cm._act, dtype=np.float64)
        self.boundary = np.asarray(cm.boundary, dtype=np.float64)
        self.budget = np.asarray(cm.budget, dtype=np.float64)
        self.ceiling = np.asarray(cm.ceiling, dtype=np.int64)
        # cheapest per-sample cost of each layer over the grid, prefix-summed: (devices, layers + 1)
        per_layer = np.diff(fwd + bwd, axis=2) / self.grid[None, :, None]
        self.min_rate_prefix = np.concatenate(
            [np.zeros((fwd.shape[0], 1)), np.cumsum(per_layer.min(axis=1), axis=1)], axis=1)

    def times(self, dev: np.ndarray, start: np.ndarray, end: np.ndarray, y: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward time of layers [start, end) on `dev` at batch y (as `cost.interpolate`)."""
        n = len(self.grid)
        k = np.searchsorted(self.grid, y, side="left")
        hi = np.minimum(k, n - 1)
        lo = np.maximum(k - 1, 0)
        g_hi, g_lo = self.grid[hi], self.grid[lo]
        exact = g_hi == y
        row_hi = (dev * n + hi) * self.width
        row_lo = (dev * n + lo) * self.width
        below, above = k == 0, k == n
        offset, span = y - g_lo, g_hi - g_lo
        out = []
        specials = [(exact, None), (below, lambda t_hi, t_lo: t_hi * y / g_hi), (above, lambda t_hi, t_lo: t_lo * y / g_lo)]
        specials = [(mask, fn) for mask, fn in specials if mask.any()]
        empty = y <= 0
        for flat in (self.fwd, self.bwd):
            t_hi = flat.take(row_hi + end) - flat.take(row_hi + start)
            t_lo = flat.take(row_lo + end) - flat.take(row_lo + start)
            # the operations in `cost.interpolate`'s order ((dt * offset) / span, not dt * (offset / span)):
            # a different rounding would make the DP's times differ from the reference's in the last bit
            with np.errstate(divide="ignore", invalid="ignore"):  # span 0 or inf * 0: replaced just below
                t = t_lo + (t_hi - t_lo) * offset / span
            for mask, fn in specials:
                t = np.where(mask, t_hi if fn is None else fn(t_hi, t_lo), t)
            if empty.any():
                t = np.where(empty, 0.0, t)
            out.append(t)
        return out[0], out[1]

    def times_at(self, dev: np.ndarray, start: np.ndarray, end: np.ndarray, y: float) -> tuple[np.ndarray, np.ndarray]:
        """`times` with the same batch y everywhere (Algorithm 1's first look, at B), bit for bit:
        the grid position and the case `times` would pick per element are picked once."""
        n = len(self.grid)
        k = int(np.searchsorted(self.grid, y, side="left"))
        hi, lo = min(k, n - 1), max(k - 1, 0)
        g_hi, g_lo = self.grid[hi], self.grid[lo]
        row_hi, row_lo = (dev * n + hi) * self.width, (dev * n + lo) * self.width
        out = []
        for flat in (self.fwd, self.bwd):
            t_hi = flat.take(row_hi + end) - flat.take(row_hi + start)
            if y <= 0:
                t = np.zeros(t_hi.shape)
            elif k == n:
                t = (flat.take(row_lo + end) - flat.take(row_lo + start)) * y / g_lo
            elif k == 0:
                t = t_hi * y / g_hi
            elif g_hi == y:
                t = t_hi
            else:
                t_lo = flat.take(row_lo + end) - flat.take(row_lo + start)
                t = t_lo + (t_hi - t_lo) * (y - g_lo) / (g_hi - g_lo)
            out.append(t)
        return out[0], out[1]

    def affine_floor(self, y: float) -> tuple[np.ndarray, np.ndarray]:
        """Lines under each layer's time, prefix-summed: (a, b), each (devices, layers + 1), with
        a_l + b_l x <= forward + backward of layer l (as `times` gives it) at every batch x in [1, B].

        A layer's time is piecewise linear in x with the grid points as breakpoints, so a line is under it
        on [1, B] when it is under its values at 1, B and the grid points between. The line runs through
        the two of those points around x = y (where the DP expects a device's share) and is lowered
        to the lowest residual: exact for a convex or affine curve (a fixed overhead plus a per-sample
        cost, which a per-sample rate alone, `min_rate_prefix`, bounds only loosely at small shares); a
        falling segment is replaced by the flat line at the curve's minimum. Kept per segment.
        """
        B = float(self.cm.B)
        xs = np.unique(np.r_[1.0, self.grid[(self.grid > 1) & (self.grid < B)], max(B, 1.0)])
        k = int(np.clip(np.searchsorted(xs, y, side="left"), 1, max(len(xs) - 1, 1)))
        cache = self.__dict__.setdefault("_affine_floors", {})
        if k in cache:
            return cache[k]
        devices, layers = self.fwd3.shape[0], self.width - 1
        dev = np.repeat(np.arange(devices), layers)
        start = np.tile(np.arange(layers), devices)
        at = np.stack([sum(self.times(dev, start, start + 1, np.full(dev.shape, x))).reshape(devices, layers)
                       for x in xs])  # (points, devices, layers)
        if len(xs) == 1:
            slope, level = np.zeros((devices, layers)), at[0]
        else:
            slope = (at[k] - at[k - 1]) / (xs[k] - xs[k - 1])
            level = at[k - 1] - slope * xs[k - 1]
            level = level + np.minimum(0.0, (at - (level + slope * xs[:, None, None])).min(axis=0))
            falling = slope < 0
            slope, level = np.where(falling, 0.0, slope), np.where(falling, at.min(axis=0), level)
        zero = np.zeros((devices, 1))
        cache[k] = (np.concatenate([zero, np.cumsum(level, axis=1)], axis=1),
                    np.concatenate([zero, np.cumsum(slope, axis=1)], axis=1))
        return cache[k]

    def range_param_bytes(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """param[end] - param[start]; the DP asks every group for the same pair list, so the last
        answer is kept (same arrays, same values)."""
        last = self.__dict__.get("_last_param_range")
        if last is None or last[0] is not start or last[1] is not end:
            last = self.__dict__["_last_param_range"] = (start, end, self.param[end] - self.param[start])
        return last[2]

    def caps(self, devices: np.ndarray, start: np.ndarray, end: np.ndarray, warmup: int) -> np.ndarray:
        """Vectorised `CostModel.max_samples` (-1: the weights alone do not fit)."""
        cm = self.cm
        spare = self.budget[devices][:, None] - cm.fixed_factor * (self.param[end] - self.param[start])[None, :]
        received = np.where(start > 0, self.boundary[np.maximum(start - 1, 0)], 0.0)
        per = warmup * (self.act[end] - self.act[start] + received)[None, :]
        ceiling = self.ceiling[devices][:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            fit = np.minimum(ceiling, np.floor_divide(spare, np.where(per == 0, 1.0, per)))
        fit = np.where(per == 0, ceiling, fit)
        return np.where(spare < 0, -1, fit).astype(np.int64)

    def ceiling_caps(self, devices: list[int], pairs: int) -> np.ndarray:
        """(devices, pairs) caps of the memory-unconstrained run: each device's ceiling (B unless the
        plan must stay within the profile's batch sizes, `CostModel.ceiling`)."""
        return np.broadcast_to(self.ceiling[np.asarray(devices)][:, None], (len(devices), pairs))


def tables_for(cm: CostModel) -> LayerTables:
    """One LayerTables per cost model (building it converts every timing to numpy)."""
    tables = cm.__dict__.get("_layer_tables")
    if tables is None:
        tables = cm.__dict__["_layer_tables"] = LayerTables(cm)
    return tables


def allocate_many(tables: LayerTables, devices: list[int], start: np.ndarray, end: np.ndarray,
                  caps: np.ndarray) -> Allocation:
    """Algorithm 1 on every column (pair) at once. `caps`: (devices, pairs) largest y per device."""
    B = tables.cm.B
    g, n = len(devices), len(start)
    dev = np.asarray(devices)[:, None].repeat(n, axis=1)
    s2, e2 = np.broadcast_to(start, (g, n)), np.broadcast_to(end, (g, n))
    feasible = (caps >= 0).all(axis=0)
    f_b, b_b = tables.times_at(dev, s2, e2, float(B))
    shares, ok = _balance(f_b + b_b, caps, B)
    feasible &= ok
    y = _integerize(shares, B)
    fwd, bwd = tables.times(dev, s2, e2, y.astype(np.float64))
    peak = peak_demand(shares, y)
    _offload_stragglers(tables, dev, start, end, caps, y, fwd, bwd, peak, feasible, block_size(B))
    return Allocation(y, fwd.max(axis=0), bwd.max(axis=0), feasible, peak)


def peak_demand(shares: np.ndarray, y: np.ndarray) -> np.ndarray:
    """What a cap must allow for Algorithm 1 to run as if uncapped, before offloading raises it.

    A capped run of phase 1 takes the same steps as the uncapped one exactly when every device's
    final share stays more than DROP_OUT_TOLERANCE below its cap (no `min` binds, no device drops
    out early). Twice the tolerance is added so that the test `peak > cap` keeps that margin
    despite rounding. The integer allocation y can exceed the share by the remainder sample.
    Offloading raises the peak to every allocation it tries (`_offload_stragglers`).
    """
    return np.maximum(y.astype(np.float64), shares + 2 * DROP_OUT_TOLERANCE)


def _balance(time_at_b: np.ndarray, caps: np.ndarray, B: int) -> tuple[np.ndarray, np.ndarray]:
    """Phase 1: proportional to capacity, capped; capped devices drop out and the rest is re-split."""
    g, n = time_at_b.shape
    capacity = 1.0 / np.maximum(time_at_b, 1e-30)
    shares = np.zeros((g, n))
    remaining = np.full(n, float(B))
    active = caps > 0
    ok = np.ones(n, dtype=bool)
    for _ in range(g + 1):
        todo = remaining > 1e-9
        if not todo.any():
            break
        weight = np.where(active, capacity, 0.0)
        total = weight.sum(axis=0)
        stuck = todo & (total == 0)
        ok &= ~stuck
        todo &= ~stuck
        with np.errstate(divide="ignore", invalid="ignore"):
            add = np.minimum(weight / total * remaining, caps - shares)
        add = np.where(active & todo, add, 0.0)
        shares += add
        remaining = np.where(todo, remaining - add.sum(axis=0), 0.0)
        active &= caps - shares > DROP_OUT_TOLERANCE
    return shares, ok & (remaining <= 1e-9)


def _integerize(shares: np.ndarray, total: int) -> np.ndarray:
    """Floor, then one more sample to the largest fractional parts (ties: lower device index)."""
    y = np.floor(shares + 1e-9).astype(np.int64)
    frac = shares - y
    missing = total - y.sum(axis=0)
    cols = np.arange(shares.shape[1])
    for round_ in range(int(missing.max(initial=0))):
        pick = frac.argmax(axis=0)
        give = missing > round_
        y[pick[give], cols[give]] += 1
        frac[pick, cols] = -np.inf
    return y


def _offload_stragglers(tables, dev, start, end, caps, y, fwd, bwd, peak, feasible, block) -> None:
    """Phase 2, in place on y/fwd/bwd/peak: move blocks from straggler to fastest device with room."""
    g = y.shape[0]
    live = np.flatnonzero(feasible)
    rows = np.arange(g)[:, None]
    for _ in range(g * (tables.cm.B // block + 1)):
        if live.size == 0:
            break
        cols = np.arange(live.size)
        t = fwd[:, live] + bwd[:, live]
        yy, cc = y[:, live], caps[:, live]
        slow = t.argmax(axis=0)
        old = t[slow, cols]
        move = np.minimum(block, yy[slow, cols])
        room = (yy + move[None, :] <= cc) & (rows != slow[None, :])
        fast = np.where(room, t, np.inf).argmin(axis=0)
        tries = (move > 0) & room.any(axis=0)
        st, en = start[live], end[live]
        sf, sb = tables.times(dev[slow, live], st, en, (yy[slow, cols] - move).astype(np.float64))
        ff, fb = tables.times(dev[fast, live], st, en, (yy[fast, cols] + move).astype(np.float64))
        t2 = t.copy()
        t2[slow, cols] = sf + sb
        t2[fast, cols] = ff + fb
        better = tries & (t2.max(axis=0) < old)
        tried = live[tries]
        peak[fast[tries], tried] = np.maximum(peak[fast[tries], tried], yy[fast[tries], cols[tries]] + move[tries])
        keep, kb = live[better], cols[better]
        y[slow[kb], keep] -= move[kb]
        y[fast[kb], keep] += move[kb]
        fwd[slow[kb], keep], bwd[slow[kb], keep] = sf[kb], sb[kb]
        fwd[fast[kb], keep], bwd[fast[kb], keep] = ff[kb], fb[kb]
        live = keep


def exposed_allreduce_many(total_s: np.ndarray, backward_s: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """`cost.exposed_allreduce` elementwise, with the same operations (bit for bit)."""
    return np.maximum(total_s / buckets, total_s - backward_s * (1 - 1 / buckets))


class GroupAllocator:
    """Algorithm 1 for one contiguous device group over a fixed list of layer pairs, computed lazily.

    Columns are computed (memory-unconstrained) the first time some caller needs them; a
    warm-up depth K then only recomputes the columns where K's memory caps bind. Per column it
    keeps E_f, E_b, feasibility and the safe K, not the samples (a column's answer does not
    depend on the others computed with it, so the few a caller asks for are recomputed).
    """

    def __init__(self, tables: LayerTables, devices: list[int], start: np.ndarray, end: np.ndarray):
        self.tables, self.devices, self.start, self.end = tables, devices, start, end
        n = len(start)
        self.forward_s, self.backward_s = np.zeros(n), np.zeros(n)
        self.feasible = np.zeros(n, dtype=bool)
        self.done = np.zeros(n, dtype=bool)
        self.safe_warmup = np.zeros(n)
        self.weights_fit = np.zeros(n, dtype=bool)
        self.allreduce = self._allreduce()
        """T_a of every pair: the whole AllReduce (`exposed` is the part a round waits for)."""
        self.buckets = np.maximum(1.0, np.ceil(tables.range_param_bytes(start, end) / ALLREDUCE_BUCKET_BYTES))
        self._time_floor: np.ndarray | None = None  # `time_floor`'s, per column (NaN: not computed yet)

    def exposed(self, cols: np.ndarray, backward_s: np.ndarray) -> np.ndarray:
        """`cost.exposed_allreduce` of columns `cols` after a last backward of `backward_s`."""
        return exposed_allreduce_many(self.allreduce[cols], backward_s, self.buckets[cols])

    def _allreduce(self) -> np.ndarray:
        cm, g = self.tables.cm, len(self.devices)
        if g <= 1:
            return np.zeros(len(self.start))
        return 2 * (g - 1) * self.tables.range_param_bytes(self.start, self.end) / (g * cm.min_bandwidth(self.devices))

    def _ensure(self, cols: np.ndarray) -> None:
        todo = cols[~self.done[cols]]
        if todo.size == 0:
            return
        unbounded = self.tables.ceiling_caps(self.devices, todo.size)
        res = allocate_many(self.tables, self.devices, self.start[todo], self.end[todo], unbounded)
        self.forward_s[todo], self.backward_s[todo], self.feasible[todo] = res.forward_s, res.backward_s, res.feasible
        self.safe_warmup[todo], self.weights_fit[todo] = self._safe_warmups(todo, res.peak)
        self.done[todo] = True

    def _safe_warmups(self, todo: np.ndarray, peak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per column: the largest K whose memory caps leave the uncapped answer as it is, and
        whether every device holds the stage's weights at all (else no K is feasible).

        Under K a device's cap is min(c, floor(spare / (K * per))) (`LayerTables.caps`; c the
        device's ceiling, B unless the plan must stay within the profile). The "uncapped" answer
        (caps c) stands when every cap is at least the device's peak demand (see `peak_demand`;
        integer caps, so its ceiling), or when every cap is c (the capped run is then the uncapped
        one, input for input). Solving for K and shrinking by 1e-9 relative
        (far above the rounding of either side) makes the threshold conservative: a column
        past it is recomputed under the real caps, which is always right, only slower.
        """
        t, cm = self.tables, self.tables.cm
        start, end = self.start[todo], self.end[todo]
        spare = t.budget[self.devices][:, None] - cm.fixed_factor * (t.param[end] - t.param[start])[None, :]
        received = np.where(start > 0, t.boundary[np.maximum(start - 1, 0)], 0.0)
        per = (t.act[end] - t.act[start] + received)[None, :]
        need = np.ceil(peak)
        ceiling = t.ceiling[self.devices][:, None].astype(np.float64)
        need = np.where((need <= ceiling).all(axis=0), need, ceiling)
        with np.errstate(divide="ignore", invalid="ignore"):
            limit = np.where(per == 0, np.inf, spare / (per * need)).min(axis=0)
        return np.floor(limit * (1 - 1e-9)), (spare >= 0).all(axis=0)

    def for_warmup(self, warmup: int, cols: np.ndarray | None = None, *, with_samples: bool = False) -> Allocation:
        """Algorithm 1 under K = `warmup` for columns `cols` (default: all), in that order.

        A column takes the uncapped run's answer up to its safe K (`_safe_warmups`): there the
        capped run takes exactly the same steps. Past it the column is recomputed under K's
        caps; on one device that only decides feasibility (the whole micro-batch fits or not).
        """
        cols = np.arange(len(self.start)) if cols is None else cols
        self._ensure(cols)
        fwd, bwd, feasible = self.forward_s[cols], self.backward_s[cols], self.feasible[cols] & self.weights_fit[cols]
        samples = None
        if with_samples:
            unbounded = self.tables.ceiling_caps(self.devices, cols.size)
            samples = allocate_many(self.tables, self.devices, self.start[cols], self.end[cols], unbounded).samples
        redo = np.flatnonzero((warmup > self.safe_warmup[cols]) & self.weights_fit[cols])
        if redo.size == 0:
            return Allocation(samples, fwd, bwd, feasible, None)
        t = self.tables
        start, end = self.start[cols[redo]], self.end[cols[redo]]
        caps = t.caps(np.asarray(self.devices), start, end, warmup)
        if len(self.devices) == 1:
            # Algorithm 1 on one device: all B samples if they fit under the cap, else infeasible
            feasible[redo] &= caps[0] >= t.cm.B
            return Allocation(samples, fwd, bwd, feasible, None)
        part = allocate_many(t, self.devices, start, end, caps)
        fwd[redo], bwd[redo], feasible[redo] = part.forward_s, part.backward_s, part.feasible
        if with_samples:
            samples[:, redo] = part.samples
        return Allocation(samples, fwd, bwd, feasible, None)

    def time_floor(self, cols: np.ndarray) -> np.ndarray:
        """A lower bound on E_f + E_b of Algorithm 1's answer on each of `cols`, under any caps; kept.

        Each device's time at y >= 1 samples is at least a + b y (`LayerTables.affine_floor` summed over
        the column's layers), so the answer's slowest device takes at least t*, where the devices that
        can take samples within t hold sum_d max(0, (t - a_d) / b_d) = f(t) samples and f(t*) = B. f
        is convex and rises, so the chord from (0, f(0)) to (t_all, f(t_all)), t_all the root of
        the sum without the max (f(t_all) >= B), meets B at or before t*: that is the floor (t* itself
        when every device takes samples). A device whose line is flat could take all B at a_d.
        """
        if self._time_floor is None:  # made on first use: most groups' tail allocators never ask
            self._time_floor = np.full(len(self.start), np.nan)
        todo = cols[np.isnan(self._time_floor[cols])]
        if todo.size:
            self._time_floor[todo] = self._chord_floor(todo)
        return self._time_floor[cols]

    def _chord_floor(self, cols: np.ndarray) -> np.ndarray:
        t, B = self.tables, float(self.tables.cm.B)
        level, slope = t.affine_floor(B / len(self.devices))
        start, end = self.start[cols], self.end[cols]
        dev = np.asarray(self.devices)[:, None]
        a = level[dev, end] - level[dev, start]
        b = slope[dev, end] - slope[dev, start]
        rising = b > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            inverse = np.where(rising, 1.0 / b, 0.0)
            t_all = (B + (a * inverse).sum(axis=0)) / inverse.sum(axis=0)
            f0 = np.maximum(0.0, -a * inverse).sum(axis=0)
            f_all = np.maximum(0.0, (t_all - a) * inverse).sum(axis=0)
            chord = np.where(f0 >= B, 0.0, t_all * (B - f0) / (f_all - f0))
        chord = np.where(np.isfinite(t_all), chord, np.inf)
        flat = np.where(rising, np.inf, a).min(axis=0)
        return np.maximum(0.0, np.minimum(chord, flat))

    def balanced_lower_bound(self, min_rate_prefix: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """A lower bound on E_f + E_b for any split: B / sum_d 1/rho_d, rho_d = cheapest per-sample rate.

        Per layer, t(y)/y is smallest at a grid point (t is piecewise linear through them and
        proportional outside), so T_d(y) >= y * rho_d; the best any split can do is then the
        continuous balance of those rates.
        """
        start, end = self.start[cols], self.end[cols]
        inverse = np.zeros(cols.size)
        for d in self.devices:
            rate = min_rate_prefix[d, end] - min_rate_prefix[d, start]
            with np.errstate(divide="ignore"):
                inverse += np.where(rate > 0, 1.0 / rate, np.inf)
        with np.errstate(divide="ignore"):
            return self.tables.cm.B / inverse


def first_minima(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Positions of each key's first lowest value, where equal keys are consecutive (one segment each,
    e.g. candidates in pair order): the minimum by `minimum.reduceat` (NaN-propagating, like argmin),
    the pick the segment's first position holding it. A segment whose minimum is NaN has none."""
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    best = np.minimum.reduceat(values, starts)
    segment = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, values.size]))
    hits = np.flatnonzero(values == best[segment])
    if hits.size == 0:
        return hits
    return hits[np.r_[True, segment[hits[1:]] != segment[hits[:-1]]]]
