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

    def cpu(self, d: int) -> "DeviceCpu":
        """Device d's CPU as communication sees it (its share of a core, a spare core, CPU per byte)."""
        dev = self.profile.devices[d]
        ring = dev.comm_cpu_s_per_byte or 0.0
        native = dev.allreduce_cpu_s_per_byte if dev.allreduce_cpu_s_per_byte is not None else ring
        return DeviceCpu(dev.compute_share(), dev.has_spare_core(), ring, native)

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


@dataclass(frozen=True)
class DeviceCpu:
    """What a device's CPU does to communication (InferenceDevice.compute_share, has_spare_core).

    `share` c: the fraction of a full-speed core its compute gets (a CFS quota of 0.084 core on one
    thread: 0.084), `spare`: a core to spare for the network threads, `ring_s_per_byte` and
    `allreduce_s_per_byte`: CPU seconds per byte sent plus received (0 when not measured)."""

    share: float = 1.0
    spare: bool = True
    ring_s_per_byte: float = 0.0
    allreduce_s_per_byte: float = 0.0

    def on_compute(self, cpu_s: float) -> float:
        """Wall seconds that `cpu_s` of communication CPU takes from this device's compute: none with a
        core to spare, else the CPU at the device's share (a 0.084-core quota: 12x the CPU time)."""
        return 0.0 if self.spare else cpu_s / self.share


def fused_plain_s(cpu: DeviceCpu, gemm_s: float, comm_cpu_s: float, wire_s: float) -> float:
    """A GEMM of `gemm_s` (wall at the device's share) then its ring without overlap.

    Two bounds, the larger wins: the device's CPU (GEMM plus the communication's CPU, at its share),
    and the critical path (GEMM and communication CPU at full speed in bursts, plus the wire). On a
    core of its own (share 1) that is GEMM + communication CPU + wire; under a CPU quota (share c < 1:
    the device computes in bursts and sits throttled between them) the wire waits fit in the
    throttled time and the CPU bound wins: plain communication costs only its CPU."""
    k = cpu.on_compute(comm_cpu_s)
    return max(gemm_s + k, cpu.share * (gemm_s + k) + wire_s)


def fused_overlap_s(cpu: DeviceCpu, gemm_s: float, comm_cpu_s: float, wire_s: float, D: int) -> float:
    """The same GEMM cut into D tiles, each running while the ring's step is on the wire (§III-D).

    Bounds: the same CPU bound as the plain ring (the overlap moves no CPU work away: the tiles
    and the transfers still share the device's cores), the critical path with (D-1)/D of the GEMM
    hiding the wire (`ring_overlap`), and the wire plus the last tile. Where the CPU bound wins the
    overlap predicts exactly the plain time, and the planner keeps the plain ring (ties go to it: the
    tiled ring adds D-1 synchronizations and smaller GEMMs, measured in docs/galaxy.md)."""
    k = cpu.on_compute(comm_cpu_s)
    burst = cpu.share * (gemm_s + k)
    return max(gemm_s + k, burst + ring_overlap(wire_s, cpu.share * gemm_s, D),
               wire_s + cpu.share * gemm_s / D)


@dataclass(frozen=True)
class GalaxyExecution:
    """How galaxy runs a layer: ring or all-reduce, and which of the four ring collectives overlap."""

    collective: str = "ring"
    block_overlap: tuple[bool, bool, bool, bool] = (False, False, False, False)


def galaxy_ring_latency(costs: "InferenceCosts", layout: "Layout", block_overlap: Sequence[bool]) -> Latency:
    """One layer on galaxy's rings, each collective overlapped or plain as `block_overlap` says: per
    collective the slowest device's fused GEMM + ring (fused_plain_s / fused_overlap_s), plus the rest of
    the attention block (scores and weighted sum) and both connective blocks on the device's rows."""
    devs, D, s = layout.devices, len(layout.devices), costs.seq_len
    tile = math.ceil(s / D)
    wire = (D - 1) * costs.ring_step_s(devs, tile) if D > 1 else 0.0
    ring_bytes = 2 * (D - 1) * tile * costs.profile.hidden * costs.profile.dtype_bytes  # sent + received
    qkv_f, out_f = gemm_fractions(costs)
    att = [costs.attention(d, a) for d, a in zip(devs, layout.heads)]
    mlp = [costs.mlp(d, b) for d, b in zip(devs, layout.columns)]
    gemms = ([qkv_f * t for t in att], [out_f * t for t in att], [0.5 * t for t in mlp], [0.5 * t for t in mlp])
    rest = max((1 - qkv_f - out_f) * t for t in att)
    con = max(costs.connective(d, r) for d, r in zip(devs, layout.rows))
    total = rest + 2 * con
    for overlapped, gemm in zip(block_overlap, gemms):
        per_device = []
        for d, g in zip(devs, gemm):
            cpu = costs.cpu(d)
            comm_cpu = cpu.ring_s_per_byte * ring_bytes
            per_device.append(fused_overlap_s(cpu, g, comm_cpu, wire, D) if overlapped and D > 1
                              else fused_plain_s(cpu, g, comm_cpu, wire))
        total += max(per_device)
    compute = max(att) + max(mlp) + 2 * con
    return Latency(compute, 4 * wire, max(total - compute, 0.0))


def allreduce_latency(costs: "InferenceCosts", layout: "Layout") -> Latency:
    """One layer with gloo's AllReduce after each block (Megatron's path) on `layout`'s heads and
    columns: per block the slowest device's block + AllReduce (a ReduceScatter and an AllGather on the
    wire, 2(D-1) steps; its CPU at the device's `allreduce_s_per_byte`), the connective blocks on the
    whole sequence on every device."""
    devs, D, s = layout.devices, len(layout.devices), costs.seq_len
    tile = math.ceil(s / D)
    wire = 2 * (D - 1) * costs.ring_step_s(devs, tile) if D > 1 else 0.0
    ar_bytes = 2 * 2 * (D - 1) * tile * costs.profile.hidden * costs.profile.dtype_bytes
    att = [costs.attention(d, a) for d, a in zip(devs, layout.heads)]
    mlp = [costs.mlp(d, b) for d, b in zip(devs, layout.columns)]
    con = max(costs.connective(d, s) for d in devs)
    total = 2 * con
    cpus = [costs.cpu(d) for d in devs]
    for block in (att, mlp):
        total += max(fused_plain_s(cpu, t, cpu.allreduce_s_per_byte * ar_bytes, wire) for cpu, t in zip(cpus, block))
    compute = max(att) + max(mlp) + 2 * con
    return Latency(compute, 2 * wire, max(total - compute, 0.0))


def choose_galaxy_execution(costs: "InferenceCosts", layout: "Layout") -> tuple[GalaxyExecution, Latency]:
    """The fastest predicted way to run galaxy's layout: each ring collective overlapped only where
    that is predicted strictly faster than plain (the four are independent: each term of
    galaxy_ring_latency depends on its own choice), then gloo's AllReduce instead of the rings when
    that is predicted strictly faster still. One device: no collective at all."""
    if len(layout.devices) < 2:
        return GalaxyExecution(), galaxy_ring_latency(costs, layout, (False,) * 4)
    plain_s = galaxy_ring_latency(costs, layout, (False,) * 4).total_s
    chosen = [galaxy_ring_latency(costs, layout, tuple(i == n for i in range(4))).total_s < plain_s for n in range(4)]
    ring = GalaxyExecution("ring", tuple(chosen))  # type: ignore[arg-type]
    ring_latency = galaxy_ring_latency(costs, layout, ring.block_overlap)
    reduce_latency = allreduce_latency(costs, layout)
    if reduce_latency.total_s < ring_latency.total_s:
        return GalaxyExecution("all-reduce"), reduce_latency
    return ring, ring_latency


def equal_split(costs: "InferenceCosts", layout: "Layout") -> "Layout":
    """Megatron's equal heads and columns on `layout`'s devices (its rows kept)."""
    D, p = len(layout.devices), costs.profile
    return Layout(layout.devices, tuple(largest_remainder(p.heads, [1.0] * D)),
                  tuple(largest_remainder(p.intermediate, [1.0] * D)), layout.rows)


EQUAL_SPLIT_MARGIN = 0.05
"""Galaxy keeps a plan of its own over Megatron's program (gloo's AllReduce on the equal split) only
when that is predicted faster by more than this fraction. Why: a profile of three identical lab hosts
measured their capacities up to 24 % apart (BERT-L in B: 0.67 / 0.72 / 0.83 per s), and the
communication CPU per byte of the ring and of the AllReduce swapped order between two profiles of one
machine (ring 1.9 ns against AllReduce 2.2, then 2.9 against 2.2, an hour apart; docs/galaxy.md). A split that
gives the extra head to the host measured 1 % faster was predicted 1.4 % faster and ran 0.98x
Megatron; the plain ring on galaxy's split, predicted 1.6 % faster, ran 0.88-0.97x: a predicted gain
inside the profile's own spread is not one."""


def galaxy_or_megatron(costs: "InferenceCosts", execution: GalaxyExecution, layout: "Layout",
                       latency: Latency) -> tuple[GalaxyExecution, "Layout", Latency]:
    """Galaxy's chosen execution on its layout, or Megatron's program (AllReduce, equal heads and
    columns) where that fits every budget and galaxy's choice is not predicted faster by more than
    EQUAL_SPLIT_MARGIN: near-equal hosts, where Algorithm 1's whole-unit rounding puts the extra head
    on whichever host the profile happened to measure fastest and ring and AllReduce are predicted
    within the profile's noise. Galaxy then runs megatron's program on megatron's shares wherever
    their layouts could coincide, and is never predicted slower than megatron where megatron fits."""
    equal = equal_split(costs, layout)
    if len(layout.devices) < 2 or any(not costs.fits(d, a, b)
                                       for d, a, b in zip(equal.devices, equal.heads, equal.columns)):
        return execution, layout, latency
    megatron_latency = allreduce_latency(costs, equal)
    if latency.total_s < megatron_latency.total_s * (1 - EQUAL_SPLIT_MARGIN):
        return execution, layout, latency
    return GalaxyExecution("all-reduce"), equal, megatron_latency


def layer_latency(costs: InferenceCosts, strategy: str, layout: Layout) -> Latency:
    """Predicted seconds of one layer of a baseline (megatron, sp, local): the slowest device per block
    plus synchronization (Eq. 4 + rings). Galaxy's is `choose_galaxy_execution`'s."""
    if strategy == "megatron":
        return allreduce_latency(costs, layout)
    devs, D, s = layout.devices, len(layout.devices), costs.seq_len
    if strategy == "sp":
        att = [costs.attention(d, costs.profile.heads, r / s) for d, r in zip(devs, layout.rows)]
        mlp = [costs.mlp(d, costs.profile.intermediate, r / s) for d, r in zip(devs, layout.rows)]
    else:
        att = [costs.attention(d, a) for d, a in zip(devs, layout.heads)]
        mlp = [costs.mlp(d, b) for d, b in zip(devs, layout.columns)]
    con = [costs.connective(d, r) for d, r in zip(devs, layout.rows)]
    compute = max(att) + max(mlp) + 2 * max(con)
    if strategy == "sp":
        comm = 2 * (D - 1) * costs.ring_step_s(devs, math.ceil(s / D))  # AllGather of K and of V in every attention block
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
