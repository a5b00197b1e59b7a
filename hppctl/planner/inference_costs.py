"""PURE: the cost model of collaborative transformer inference (Galaxy, paper §III-C) and the
registry of inference strategies.

A leaf of `hppctl.planner`: the strategies (`hppctl/planner/strategies/{galaxy,megatron,sp,local}.py`)
import their types and `inference_strategy` from here, and `hppctl.planner.galaxy` (the planner that
runs them) imports them, so neither imports the other back. The readings of what the paper leaves
open are listed in `hppctl/planner/galaxy.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hppctl.errors import BadInput
from hppctl.models.inference import BlockGrid, InferenceProfile, SeqLenTimings


# --- latency functions ------------------------------------------------------------------------------

def interpolate(grid: BlockGrid, size: float) -> float:
    """Seconds at `size` by piecewise-linear interpolation; proportional outside the grid (0 at 0)."""
    if size <= 0:
        return 0.0
    xs, ys = grid.sizes, grid.seconds
    if size <= xs[0]:
        return ys[0] * size / xs[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if size <= x1:
            return y0 + (y1 - y0) * (size - x0) / (x1 - x0)
    return ys[-1] * size / xs[-1]


def timings_at(timings: Sequence[SeqLenTimings], seq_len: int, device: str) -> Callable[[str, float], float]:
    """`f(block, size)` at `seq_len`: the profiled length itself, or linear between the two around it."""
    lengths = [t.seq_len for t in timings]
    for t in timings:
        if t.seq_len == seq_len:
            return lambda block, size, t=t: interpolate(getattr(t, block), size)
    below = [t for t in timings if t.seq_len < seq_len]
    above = [t for t in timings if t.seq_len > seq_len]
    if not below or not above:
        raise BadInput(f"--seq-len: {seq_len} is outside the sequence lengths profiled for device {device} "
                       f"({', '.join(map(str, lengths))}); profile with --seq-len {seq_len}")
    lo, hi = below[-1], above[0]
    w = (seq_len - lo.seq_len) / (hi.seq_len - lo.seq_len)

    def at(block: str, size: float) -> float:
        return (1 - w) * interpolate(getattr(lo, block), size) + w * interpolate(getattr(hi, block), size)

    return at


def split_rows(seq_len: int, parts: int) -> list[int]:
    """Equal sequence partition in whole rows: the first `seq_len mod parts` parts get one row more."""
    base, extra = divmod(seq_len, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """Whole shares of `total` in proportion to `weights`, summing to `total` (Hamilton's method)."""
    whole = sum(weights)
    if whole <= 0:
        raise ValueError("weights must not all be zero")
    exact = [total * w / whole for w in weights]
    shares = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[:total - sum(shares)]:
        shares[i] += 1
    return shares


@dataclass(frozen=True)
class InferenceCosts:
    """The profile at one sequence length: what every strategy needs."""

    profile: InferenceProfile
    seq_len: int
    names: list[str] = field(init=False)
    budget: list[int] = field(init=False)
    _at: list[Callable[[str, float], float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", [d.name for d in self.profile.devices])
        object.__setattr__(self, "budget", [d.memory_bytes for d in self.profile.devices])
        object.__setattr__(self, "_at", [timings_at(d.timings, self.seq_len, d.name) for d in self.profile.devices])

    @property
    def D(self) -> int:
        return len(self.names)

    @property
    def layers(self) -> int:
        return self.profile.num_layers

    def attention(self, d: int, heads: float, seq_fraction: float = 1.0) -> float:
        return self._at[d]("attention", heads) * seq_fraction

    def mlp(self, d: int, columns: float, seq_fraction: float = 1.0) -> float:
        return self._at[d]("mlp", columns) * seq_fraction

    def connective(self, d: int, rows: float) -> float:
        return self._at[d]("connective", rows)

    def capacity(self, d: int) -> float:
        """V_d (Eq. 6): the inverse of one whole attention block plus one whole MLP block."""
        whole = self.attention(d, self.profile.heads) + self.mlp(d, self.profile.intermediate)
        return 1.0 / whole if whole > 0 else math.inf

    def memory(self, heads: int, columns: int) -> int:
        """Eq. 5's left side, l * (M_att * a / n_h + M_mlp * b / 4h), plus the replicated embeddings."""
        p = self.profile
        layers = p.num_layers * (p.attention_bytes * heads / p.heads + p.mlp_bytes * columns / p.intermediate)
        return math.ceil(layers) + p.embedding_bytes

    def fits(self, d: int, heads: int, columns: int) -> bool:
        return self.memory(heads, columns) < self.budget[d]  # the paper's strict inequality

    def ring_step_s(self, order: Sequence[int], rows: int) -> float:
        """One ring step moving `rows` rows of hidden activations: set by the slowest link of the ring."""
        if len(order) < 2:
            return 0.0
        p = self.profile
        rate = min(p.bandwidth_between(self.names[a], self.names[b])
                   for a, b in zip(order, list(order[1:]) + [order[0]]))
        return rows * p.hidden * p.dtype_bytes / rate


# --- layouts and their latency --------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """A strategy's answer: devices (indices into the profile) in ring order with their A, B, S."""

    devices: tuple[int, ...]
    heads: tuple[int, ...]
    columns: tuple[int, ...]
    rows: tuple[int, ...]
    memory_aware: bool = True


@dataclass(frozen=True)
class Latency:
    compute_s: float
    communication_s: float
    exposed_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_s


def gemm_fractions(costs: InferenceCosts) -> tuple[float, float]:
    """FLOP share of the QKV projection and of the output projection in one attention block."""
    h, s = costs.profile.hidden, costs.seq_len
    total = 8 * h + 4 * s  # per head and d_k: 6h (QKV) + 4s (scores, AV) + 2h (output)
    return 6 * h / total, 2 * h / total


def ring_overlap(comm_s: float, gemm_s: float, D: int) -> float:
    """Exposed time of a ring of D-1 steps overlapped with a GEMM cut into D tiles (§III-D):
    D-1 of the tiles run while a step is in flight, so about (D-1)/D of the GEMM hides communication."""
    return max(comm_s - gemm_s * (D - 1) / D, 0.0)


def layer_latency(costs: InferenceCosts, strategy: str, layout: Layout, *, overlap: bool) -> Latency:
    """Predicted seconds of one layer: the slowest device per block plus synchronization (Eq. 4 + rings)."""
    devs, D, s = layout.devices, len(layout.devices), costs.seq_len
    tile = math.ceil(s / D)
    step = costs.ring_step_s(devs, tile)
    if strategy == "sp":
        att = [costs.attention(d, costs.profile.heads, r / s) for d, r in zip(devs, layout.rows)]
        mlp = [costs.mlp(d, costs.profile.intermediate, r / s) for d, r in zip(devs, layout.rows)]
    else:
        att = [costs.attention(d, a) for d, a in zip(devs, layout.heads)]
        mlp = [costs.mlp(d, b) for d, b in zip(devs, layout.columns)]
    con = [costs.connective(d, r) for d, r in zip(devs, layout.rows)]
    compute = max(att) + max(mlp) + 2 * max(con)
    if strategy == "galaxy":
        ring = (D - 1) * step  # one AllGather or one ReduceScatter
        comm = 4 * ring
        if overlap and D > 1:
            qkv, out = gemm_fractions(costs)
            exposed = (ring_overlap(ring, qkv * max(att), D) + ring_overlap(ring, out * max(att), D)
                       + 2 * ring_overlap(ring, 0.5 * max(mlp), D))
        else:
            exposed = comm
        return Latency(compute, comm, exposed)
    if strategy == "megatron":
        comm = 2 * 2 * (D - 1) * step  # two ring AllReduces = ReduceScatter + AllGather each
        return Latency(compute, comm, comm)
    if strategy == "sp":
        comm = 2 * (D - 1) * step  # AllGather of K and of V in every attention block
        return Latency(compute, comm, comm)
    return Latency(compute, 0.0, 0.0)


# --- Algorithm 1 --------------------------------------------------------------------------------------

def balanced_partition(total: int, capacities: Sequence[float]) -> list[int]:
    """BalancedPartition(T, V): workload in proportion to capacity (Algorithm 1, lines 1-8)."""
    return largest_remainder(total, capacities)


def memory_aware_balancing(costs: InferenceCosts, block: str, heads: list[int], columns: list[int],
                           capacity: Sequence[float], active: list[int]) -> None:
    """MemoryAwareBalancing(T, C, V, L) (Algorithm 1, lines 9-19), in place on `heads`/`columns`.

    Out-of-memory devices push the whole units of block T that bring them under budget to the
    devices of L that still have room, in proportion to those devices' capacity, and leave L.
    Repeats (the paper's recursion) until no device of L is over budget or none has room.
    """
    p = costs.profile
    share = columns if block == "mlp" else heads
    unit_bytes = p.num_layers * (p.mlp_bytes / p.intermediate if block == "mlp" else p.attention_bytes / p.heads)
    while True:
        oom = [d for d in active if not costs.fits(d, heads[d], columns[d])]
        free = [d for d in active if d not in oom]
        if not oom or not free or unit_bytes <= 0:
            return
        for o in oom:
            excess = costs.memory(heads[o], columns[o]) - costs.budget[o]
            waiting = min(math.floor(excess / unit_bytes) + 1, share[o])
            for f, moved in zip(free, largest_remainder(waiting, [capacity[f] for f in free])):
                share[f] += moved
            share[o] -= waiting
            active.remove(o)


def galaxy_layout(costs: InferenceCosts) -> Layout | None:
    """Algorithm 1: capacity-proportional heads and columns, then memory-aware shifting (MLP first,
    then MHA); None when some device is still over its budget."""
    devices = list(range(costs.D))
    capacity = [costs.capacity(d) for d in devices]
    heads = balanced_partition(costs.profile.heads, capacity)
    columns = balanced_partition(costs.profile.intermediate, capacity)
    memory_aware_balancing(costs, "mlp", heads, columns, capacity, list(devices))
    memory_aware_balancing(costs, "mha", heads, columns, capacity, list(devices))
    if any(not costs.fits(d, heads[d], columns[d]) for d in devices):
        return None
    return Layout(tuple(devices), tuple(heads), tuple(columns), tuple(split_rows(costs.seq_len, costs.D)))


# --- strategies by name and the plan -------------------------------------------------------------------

LayoutFn = Callable[[InferenceCosts], "Layout | None"]
INFERENCE_STRATEGIES: dict[str, LayoutFn] = {}
INFERENCE_DESCRIPTIONS: dict[str, str] = {}
SYNC = {"galaxy": "reduce-scatter+all-gather", "megatron": "all-reduce", "sp": "kv-all-gather", "local": "none"}


def inference_strategy(name: str, description: str):
    def register(fn: LayoutFn) -> LayoutFn:
        INFERENCE_STRATEGIES[name] = fn
        INFERENCE_DESCRIPTIONS[name] = description
        return fn
    return register
