"""Bi-Partition's cost model (Cui et al., J. Cloud Computing 2023; notes/bipartition.md): each worker
runs the forward of one contiguous layer range and the backward of another, both ordered across
workers (the paper's Eq. 1). Layer-wise partitioning is the special case of equal cuts.

Workers are devices in a fixed order, worker 0 at the head. A plan is two cut sequences,
`forward = (0 = f_0 <= f_1 <= ... <= f_W = L)` and `backward = (0 = b_0 <= ... <= b_W = L)`:
worker w runs F of layers [f_w, f_{w+1}) and B of [b_w, b_{w+1}) (half-open; either may be empty,
never both). A layer whose forward owner differs from its backward owner is a *split* layer.

Cost of one micro-batch in the steady state (the paper's T(U), extended as notes §6.2 asks):

- worker w: its forwards and backwards on its own device, plus, with `recompute`, the forward of
  every split layer it backwards (PyTorch keeps no autograd graph across processes, so the
  backward owner re-runs the split layer's forward from the layer's input);
- messages: to the next worker the activations at the forward cut, to the previous one the
  gradients at the backward cut; for split layers the input of a split block the backward owner
  does not hold (with `recompute`), or the block's saved tensors plus that input (without: the
  backward owner receives them), and the split layers' updated weights back to the forward owner
  once per round (1/M per micro-batch);
- a worker's uplink carries everything it sends, one message after another (each device has one
  egress: the lab shapes it, the simulator models it); the paper's model (`uplink=False`) has one
  half-duplex link per pair instead, both directions summed;
- the bottleneck is the largest of all worker and link times (Eq. 3: the max over sub-pipelines
  and the boundary transfer).

Memory of a worker (bytes; the paper leaves Mem(U) undefined, notes §7.8): the weights of every
layer it touches, gradient accumulator and optimizer state of the layers it backwards (it steps
them), and for each of its K in-flight micro-batches the tensors its backward will need: the saved
tensors of layers it runs both ways plus their input, the input of a split block (or its saved
tensors when received), and one micro-batch of a split block's recomputed tensors during a backward.
With equal cuts this is exactly the Asteroid model's Eq. 3 (`CostModel.memory`).

The data input (cut 0) is read by whichever worker needs it (every worker derives the sample
order), and the loss is computed by the backward owner of the last layer, so cuts 0 and L carry
no bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hppctl.planner.cost import WARMUP_POLICIES, CostModel, Step, round_latency


@dataclass(frozen=True)
class BiOptions:
    """What the cost model counts. `BiOptions.paper()` is the paper's own model."""

    recompute: bool = True
    """The backward owner of a split layer re-runs its forward (True) or receives its saved tensors."""
    split_traffic: bool = True
    """Count split layers' inputs/saved tensors and weight send-back on links (the paper does not)."""
    equal_cuts: bool = False
    """Force f_w = b_w: the layer-wise special case."""
    interleave: bool = True
    """Split layers only between neighbouring workers (what the runtime executes; always on with
    `split_traffic`, which the DP prices exactly only there). Off: the paper's whole Eq. 1 space."""

    uplink: bool = True
    """A worker's sends share its uplink (one egress per device: the lab's shaping, the simulator's
    model). False: the paper's model, one half-duplex link per pair with both directions summed."""

    @classmethod
    def paper(cls) -> "BiOptions":
        return cls(recompute=False, split_traffic=False, interleave=False, uplink=False)

    @property
    def interleaved_only(self) -> bool:
        return self.interleave or self.split_traffic


@dataclass(frozen=True)
class BiCosts:
    """Per-micro-batch costs of every layer on every worker of one device order."""

    fwd: np.ndarray
    """(W, L) seconds of one micro-batch's forward of each layer on worker w's device."""
    bwd: np.ndarray
    boundary: np.ndarray
    """(L + 1,) bytes of one micro-batch crossing cut c (the layer input of layer c); 0 at 0 and L."""
    act: np.ndarray
    """(L,) bytes of one micro-batch each layer keeps for its backward."""
    params: np.ndarray
    """(L,) parameter bytes of each layer."""
    bandwidth: np.ndarray
    """(W, W) bytes/s between workers (inf on the diagonal)."""
    budget: np.ndarray
    """(W,) memory budget bytes (inf: unchecked)."""
    warmup: tuple[int, ...]
    """Micro-batches each worker holds in flight (its 1F1B warm-up depth K_w)."""
    num_micro_batches: int
    optimizer_factor: float = 1.0
    options: BiOptions = field(default_factory=BiOptions)

    def __post_init__(self) -> None:
        # Prefix sums: any range's cost is a difference (the DP reads them in bulk).
        object.__setattr__(self, "fwd_prefix", np.concatenate([np.zeros((self.W, 1)), np.cumsum(self.fwd, 1)], 1))
        object.__setattr__(self, "bwd_prefix", np.concatenate([np.zeros((self.W, 1)), np.cumsum(self.bwd, 1)], 1))
        object.__setattr__(self, "act_prefix", np.concatenate([[0.0], np.cumsum(self.act)]))
        object.__setattr__(self, "param_prefix", np.concatenate([[0.0], np.cumsum(self.params)]))

    @property
    def W(self) -> int:
        return int(self.fwd.shape[0])

    @property
    def L(self) -> int:
        return int(self.fwd.shape[1])

    def with_options(self, options: BiOptions) -> "BiCosts":
        return BiCosts(self.fwd, self.bwd, self.boundary, self.act, self.params, self.bandwidth, self.budget,
                       self.warmup, self.num_micro_batches, self.optimizer_factor, options)


def costs_from_model(cm: CostModel, order: list[int], options: BiOptions = BiOptions(),
                     schedule: str = "1f1b-asteroid") -> BiCosts:
    """The planner's cost model read for workers `order` (device indices, head first) at batch B."""
    L, W, B = cm.num_layers, len(order), cm.B
    fwd = np.array([[cm.forward_time(d, l, l + 1, B) for l in range(L)] for d in order])
    bwd = np.array([[cm.backward_time(d, l, l + 1, B) for l in range(L)] for d in order])
    boundary = np.zeros(L + 1)
    boundary[1:L] = [B * cm.boundary[c - 1] for c in range(1, L)]
    act = np.array([B * (cm._act[l + 1] - cm._act[l]) for l in range(L)], dtype=float)
    params = np.array([cm.param_bytes(l, l + 1) for l in range(L)], dtype=float)
    bandwidth = np.array([[cm.bw[a][b] for b in order] for a in order], dtype=float)
    budget = np.array([cm.budget[d] for d in order], dtype=float)
    warmup = tuple(WARMUP_POLICIES[schedule](W, w, cm.M) for w in range(W))
    return BiCosts(fwd, bwd, boundary, act, params, bandwidth, budget, warmup, cm.M,
                   cm.profile.optimizer_state_factor, options)


# --- one worker, one link: array-friendly, shared by the DP, the binary search and the evaluation ----

def worker_time(c: BiCosts, w: int, i1, j1, i2, j2):
    """Seconds of worker w per micro-batch for F [i1, j1) and B [i2, j2) (numpy-broadcastable)."""
    fp, bp = c.fwd_prefix[w], c.bwd_prefix[w]
    total = (fp[j1] - fp[i1]) + (bp[j2] - bp[i2])
    if c.options.recompute:
        total = total + _uncovered(fp, i1, j1, i2, j2)
    return total


def _uncovered(prefix: np.ndarray, i1, j1, i2, j2):
    """Sum over layers of [i2, j2) outside [i1, j1) (the split layers a worker backwards)."""
    before = np.where(i2 < i1, prefix[np.minimum(i1, j2)] - prefix[i2], 0.0)
    after = np.where(j2 > j1, prefix[j2] - prefix[np.maximum(j1, i2)], 0.0)
    return before + after


def worker_memory(c: BiCosts, w: int, i1, j1, i2, j2):
    """Peak bytes of worker w for F [i1, j1) and B [i2, j2) (see the module docstring)."""
    pp, ap, bnd = c.param_prefix, c.act_prefix, c.boundary
    both_lo, both_hi = np.maximum(i1, i2), np.minimum(j1, j2)
    overlap = both_hi > both_lo
    both_params = np.where(overlap, pp[np.maximum(both_hi, both_lo)] - pp[both_lo], 0.0)
    fixed = (pp[j1] - pp[i1]) + (pp[j2] - pp[i2]) - both_params + (1.0 + c.optimizer_factor) * (pp[j2] - pp[i2])
    both = np.where(overlap, ap[np.maximum(both_hi, both_lo)] - ap[both_lo] + bnd[both_lo], 0.0)
    prefix_split, suffix_split = i2 < i1, j2 > j1
    split_acts = _uncovered(ap, i1, j1, i2, j2)
    # A split block's backward starts from its input: received at b_w for the part before the
    # forward range, the worker's own output at f_{w+1} (or b_w past it) for the part after.
    inputs = np.where(prefix_split, bnd[i2], 0.0) + np.where(suffix_split, bnd[np.maximum(j1, i2)], 0.0)
    if c.options.recompute:
        return fixed + c.warmup[w] * (both + inputs) + split_acts
    return fixed + c.warmup[w] * (both + inputs + split_acts)


def forward_bytes(c: BiCosts, i1, i2):
    """Bytes per micro-batch worker w-1 sends worker w when w's ranges start at f_w = i1, b_w = i2.

    With interleaved cuts every split layer lies between neighbours: [i2, i1) is w's prefix split
    (forward on w-1, which sends the block's input at i2), [i1, i2) is w-1's suffix split (forward
    on w, backward on w-1, which holds the block's input, its own output at i1, and sends the
    block's new weights)."""
    total = c.boundary[i1]
    if not c.options.split_traffic:
        return total
    ap, pp = c.act_prefix, c.param_prefix
    prefix_split, suffix_split = i2 < i1, i1 < i2
    total = total + np.where(prefix_split, c.boundary[i2], 0.0)
    if not c.options.recompute:
        total = total + np.where(prefix_split, ap[i1] - ap[np.minimum(i1, i2)], 0.0)
    return total + np.where(suffix_split, pp[i2] - pp[np.minimum(i1, i2)], 0.0) / c.num_micro_batches


def backward_bytes(c: BiCosts, i1, i2):
    """Bytes per micro-batch worker w sends worker w-1 (see `forward_bytes`): the gradients at the
    backward cut, the weights of w's prefix split, saved tensors of w-1's suffix split (receive mode)."""
    total = c.boundary[i2]
    if not c.options.split_traffic:
        return total
    ap, pp = c.act_prefix, c.param_prefix
    prefix_split, suffix_split = i2 < i1, i1 < i2
    if not c.options.recompute:
        total = total + np.where(suffix_split, ap[i2] - ap[np.minimum(i1, i2)], 0.0)
    return total + np.where(prefix_split, pp[i1] - pp[np.minimum(i1, i2)], 0.0) / c.num_micro_batches


def link_bytes(c: BiCosts, i1, i2):
    """Both directions between worker w-1 and w (the paper's half-duplex pair)."""
    return forward_bytes(c, i1, i2) + backward_bytes(c, i1, i2)


# --- a whole plan -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class BiResult:
    forward: tuple[int, ...]
    """Forward cuts f_0 = 0 <= ... <= f_W = L."""
    backward: tuple[int, ...]
    bottleneck_s: float
    worker_s: tuple[float, ...]
    links: dict[tuple[int, ...], float]
    """Seconds per micro-batch: (w,) -> worker w's uplink; with the paper's pair model (a, b), a < b."""
    memory_bytes: tuple[float, ...]
    feasible: bool

    @property
    def ranges(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        return [((self.forward[w], self.forward[w + 1]), (self.backward[w], self.backward[w + 1]))
                for w in range(len(self.forward) - 1)]


def owners(cuts: tuple[int, ...] | list[int], L: int) -> list[int]:
    """Owner worker of every layer under one cut sequence."""
    out = [0] * L
    for w in range(len(cuts) - 1):
        for l in range(cuts[w], cuts[w + 1]):
            out[l] = w
    return out


def interleaved(forward, backward) -> bool:
    """Every split layer lies between neighbouring workers: max(f_w, b_w) <= min(f_{w+1}, b_{w+1})."""
    return all(max(forward[w], backward[w]) <= min(forward[w + 1], backward[w + 1]) for w in range(len(forward) - 1))


def valid_cuts(forward, backward, L: int) -> bool:
    W = len(forward) - 1
    if len(backward) != W + 1 or forward[0] != 0 or backward[0] != 0 or forward[-1] != L or backward[-1] != L:
        return False
    if any(forward[w] > forward[w + 1] or backward[w] > backward[w + 1] for w in range(W)):
        return False
    return all(forward[w] < forward[w + 1] or backward[w] < backward[w + 1] for w in range(W))


def evaluate(c: BiCosts, forward, backward) -> BiResult:
    """Bottleneck, per-worker and per-link times and memory of any cuts in Eq. 1's space.

    Split layers between non-neighbours (cuts that do not interleave) are costed too: their traffic
    goes straight from one worker to the other; this is what the exhaustive search compares against.
    """
    L, W = c.L, c.W
    if not valid_cuts(forward, backward, L):
        raise ValueError(f"invalid cuts forward={list(forward)} backward={list(backward)} for {L} layers, {W} workers")
    if c.options.equal_cuts and list(forward) != list(backward):
        raise ValueError("equal_cuts: forward and backward cuts differ")
    worker = [float(worker_time(c, w, forward[w], forward[w + 1], backward[w], backward[w + 1])) for w in range(W)]
    load = _link_loads(c, forward, backward)
    links = _link_times(c, load)
    memory = tuple(float(worker_memory(c, w, forward[w], forward[w + 1], backward[w], backward[w + 1]))
                   for w in range(W))
    feasible = all(m <= c.budget[w] for w, m in enumerate(memory))
    bottleneck = max(worker + list(links.values()))
    return BiResult(tuple(forward), tuple(backward), bottleneck, tuple(worker), links, memory, feasible)


def _link_times(c: BiCosts, load: dict[tuple[int, int], float]) -> dict[tuple[int, ...], float]:
    """Uplink model: (w,) -> seconds of everything w sends; pair model: (a, b) -> both directions."""
    times: dict[tuple[int, ...], float] = {}
    for (src, dst), nbytes in load.items():
        key = (src,) if c.options.uplink else (min(src, dst), max(src, dst))
        times[key] = times.get(key, 0.0) + nbytes / c.bandwidth[src, dst]
    return {k: t for k, t in times.items() if t > 0}


def _link_loads(c: BiCosts, forward, backward) -> dict[tuple[int, int], float]:
    """(src, dst) -> bytes per micro-batch."""
    L, W = c.L, c.W
    load: dict[tuple[int, int], float] = {}

    def add(a: int, b: int, nbytes: float) -> None:
        if a != b and nbytes > 0:
            load[(a, b)] = load.get((a, b), 0.0) + float(nbytes)

    for w in range(1, W):
        add(w - 1, w, c.boundary[forward[w]])
        add(w, w - 1, c.boundary[backward[w]])
    if not c.options.split_traffic:
        return load
    fo, bo = owners(forward, L), owners(backward, L)
    for l in range(L):
        if fo[l] != bo[l]:
            add(bo[l], fo[l], c.params[l] / c.num_micro_batches)
            if not c.options.recompute:
                add(fo[l], bo[l], c.act[l])
    for w in range(W):
        # The backward of a prefix split [b_w, f_w) starts from the input at b_w, which only the
        # forward owner of layer b_w has (w holds the activations at f_w and f_{w+1}).
        start = backward[w]
        if backward[w] < backward[w + 1] and start not in (forward[w], forward[w + 1]) and 0 < start < L:
            add(fo[start], w, c.boundary[start])
    return load


def round_estimate(c: BiCosts, result: BiResult) -> tuple[float, list[Step]]:
    """Round latency under synchronous 1F1B: Asteroid's closed form (Eq. 4) on the workers' forward
    and backward times and the neighbour links, plus the split layers' weight send-back at round end.
    Only meaningful for interleaved cuts (what the DP returns)."""
    W = c.W
    steps: list[Step] = []
    for w, ((i1, j1), (i2, j2)) in enumerate(result.ranges):
        fp = c.fwd_prefix[w]
        backward = worker_time(c, w, i1, j1, i2, j2) - (fp[j1] - fp[i1])
        steps.append(Step(float(fp[j1] - fp[i1]), float(backward)))
        if w + 1 < W:
            f, b = result.forward[w + 1], result.backward[w + 1]
            bw = c.bandwidth[w, w + 1]
            steps.append(Step(float(forward_bytes(c, f, b) / bw), float(backward_bytes(c, f, b) / bw)))
    return round_latency(steps, c.num_micro_batches) + send_back_seconds(c, result.forward, result.backward), steps


def send_back_seconds(c: BiCosts, forward, backward) -> float:
    """The round's weight send-back: the largest of the links' split-layer weights over their
    bandwidth (the links send in parallel, once per round, after STEP)."""
    return max((float(send_back_at(c, w, forward[w], backward[w])) for w in range(1, c.W)), default=0.0)


def send_back_at(c: BiCosts, w: int, i1, i2):
    """Seconds of the send-back from worker w to w-1 or back (w >= 1) when w starts at (f_w, b_w) =
    (i1, i2): the weights of the split layers between the two cuts, either order (numpy-broadcastable)."""
    if not c.options.split_traffic:
        return np.zeros(np.broadcast(i1, i2).shape)
    pp = c.param_prefix
    return (pp[np.maximum(i1, i2)] - pp[np.minimum(i1, i2)]) / c.bandwidth[w - 1, w]


def split_blocks(forward, backward, L: int) -> list[tuple[int, int, int, int]]:
    """Maximal runs of split layers: (start, end, forward owner, backward owner)."""
    fo, bo = owners(forward, L), owners(backward, L)
    blocks: list[tuple[int, int, int, int]] = []
    for l in range(L):
        if fo[l] == bo[l]:
            continue
        if blocks and blocks[-1][1] == l and blocks[-1][2:] == (fo[l], bo[l]):
            blocks[-1] = (blocks[-1][0], l + 1, fo[l], bo[l])
        else:
            blocks.append((l, l + 1, fo[l], bo[l]))
    return blocks


def coarsen_costs(c: BiCosts, groups: int) -> tuple[BiCosts, list[int]]:
    """Merge consecutive layers into at most `groups` super-layers; returns the coarse costs and the
    fine cut of every coarse cut. Every term of the model sums over layers or reads the boundary
    at a cut, so coarse cuts cost exactly what the same fine cuts cost (a coarse plan is a fine one)."""
    L = c.L
    size = -(-L // groups)
    cuts = list(range(0, L, size)) + [L]
    ends = cuts[1:]
    group_sum = lambda a: np.add.reduceat(a, cuts[:-1], axis=-1)  # noqa: E731
    coarse = BiCosts(group_sum(c.fwd), group_sum(c.bwd), c.boundary[cuts], group_sum(c.act), group_sum(c.params),
                     c.bandwidth, c.budget, c.warmup, c.num_micro_batches, c.optimizer_factor, c.options)
    assert len(ends) == coarse.L
    return coarse, cuts


def refine(c: BiCosts, result: BiResult, max_rounds: int = 100,
           objective: Callable[[BiCosts, BiResult], float] | None = None) -> BiResult:
    """Hill-climb on fine layers: move one forward or backward cut by one layer while the objective
    drops (cuts stay valid, interleaved where the options ask, within memory). Default objective:
    the bottleneck; the strategies pass the one they searched the coarse cuts for."""
    score = objective or (lambda _, r: r.bottleneck_s)
    best, best_score = result, score(c, result)
    for _ in range(max_rounds):
        improved = False
        for which in (0, 1):
            for w in range(1, c.W):
                for delta in (-1, 1):
                    cuts = [list(best.forward), list(best.backward)]
                    cuts[which][w] += delta
                    if c.options.equal_cuts:
                        cuts[1 - which][w] += delta
                    if not valid_cuts(cuts[0], cuts[1], c.L):
                        continue
                    if c.options.interleaved_only and not interleaved(cuts[0], cuts[1]):
                        continue
                    moved = evaluate(c, cuts[0], cuts[1])
                    if not moved.feasible:
                        continue
                    moved_score = score(c, moved)
                    if moved_score < best_score * (1 - 1e-12):
                        best, best_score, improved = moved, moved_score, True
        if not improved:
            return best
    return best

