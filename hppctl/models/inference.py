"""Collaborative transformer inference (Galaxy): the inference profile and the inference plan.

`InferenceProfile` is what `hppctl profile --seq-len N` writes: per device, the latency of one
layer's attention block by number of heads, of its MLP block by number of intermediate columns and
of one connective block by sequence rows, at each profiled sequence length; the bytes of one
layer's attention and MLP weights (M_att, M_mlp of the paper's Eq. 5) and each device's budget.

`InferencePlan` is what `hppctl plan --strategy galaxy|megatron|sp|local --seq-len N` writes: the
heads, MLP columns and sequence rows of every device (the paper's A, B, S), the synchronization the
strategy uses, and the predicted latency. Rows are contiguous: device i owns rows
[sum(rows[:i]), sum(rows[:i+1])) of the sequence, in the order the shares are listed, and so do
heads and columns (device i owns heads [sum(heads[:i]), …) of every layer).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import Field, model_validator

from hppctl.limits import MAX_DEVICES
from hppctl.models.base import FrozenModel, duplicates, listed
from hppctl.models.cluster import DeviceName

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]

BLOCK_COLLECTIVES: tuple[str, ...] = ("attention_in", "attention_out", "mlp_in", "mlp_out")
"""Galaxy's four ring collectives of a layer, in execution order: the AllGather fused with the QKV
GEMM, the output GEMM fused with the ReduceScatter, and the same two around the MLP."""
Collective = Literal["ring", "all-reduce"]

InferenceStrategy = Literal["galaxy", "megatron", "sp", "local"]
INFERENCE_STRATEGIES: tuple[str, ...] = ("galaxy", "megatron", "sp", "local")
Family = Literal["bert", "distilbert", "gpt2", "opt"]


class BlockGrid(FrozenModel):
    """Seconds of one block at several partition sizes (`sizes` increasing), at one sequence length."""

    sizes: Annotated[list[PosInt], Field(min_length=1)]
    seconds: Annotated[list[NonNegFloat], Field(min_length=1)]

    @model_validator(mode="after")
    def _aligned(self) -> "BlockGrid":
        if len(self.sizes) != len(self.seconds):
            raise ValueError(f"{len(self.sizes)} sizes but {len(self.seconds)} timings")
        if sorted(set(self.sizes)) != self.sizes:
            raise ValueError(f"sizes must be strictly increasing, got {self.sizes}")
        return self


class SeqLenTimings(FrozenModel):
    """One device's block latencies at one sequence length (one layer's blocks)."""

    seq_len: PosInt
    attention: BlockGrid
    """By number of heads (the whole sequence, QKV projection to output projection, no bias of the latter)."""
    mlp: BlockGrid
    """By number of intermediate columns (both GEMMs and the activation)."""
    connective: BlockGrid
    """By sequence rows (bias, dropout, residual add, LayerNorm)."""


class InferenceDevice(FrozenModel):
    name: DeviceName
    kind: str
    """Preset name, or `measured:<hostname>`."""
    source: Literal["preset", "measured"]
    memory_bytes: PosInt
    """Budget_d: memory the planner may use for this device's share of the layer weights."""
    timings: Annotated[list[SeqLenTimings], Field(min_length=1)]
    """Increasing sequence lengths."""
    threads: PosInt | None = None
    """Measured: torch threads the blocks were timed with."""
    cpu_cores: PositiveFloat | None = None
    """Measured: the CPU the device's process may use, in cores (its cgroup quota, else its CPUs).
    None (presets, profiles written before): unknown, taken as a core to spare for the network."""
    comm_cpu_s_per_byte: NonNegFloat | None = None
    """Measured over the cluster's links (profiling/comm_cpu.py): process CPU seconds (gloo's threads
    included) the device spends per byte it sends plus receives in galaxy's plain ring collectives.
    None (a single measured device, presets, profiles written before): communication takes no CPU
    from compute, the paper's assumption."""
    allreduce_cpu_s_per_byte: NonNegFloat | None = None
    """The same for gloo's own AllReduce (Megatron's collective). None: as `comm_cpu_s_per_byte`."""

    def has_spare_core(self) -> bool:
        """True when the device can run the network's CPU work beside its compute threads without
        taking from them: unknown CPU counts as spare (the paper's Jetsons have four cores)."""
        return self.cpu_cores is None or self.cpu_cores >= (self.threads or 1) + 1

    def compute_share(self) -> float:
        """The fraction of a full-speed core each compute thread gets: < 1 under a CPU quota below
        the thread count (a lab host's cgroup), 1 when unknown."""
        if self.cpu_cores is None:
            return 1.0
        return min(1.0, self.cpu_cores / (self.threads or 1))

    @model_validator(mode="after")
    def _increasing(self) -> "InferenceDevice":
        lengths = [t.seq_len for t in self.timings]
        if sorted(set(lengths)) != lengths:
            raise ValueError(f"device {self.name}: sequence lengths must be strictly increasing, got {lengths}")
        return self


class InferenceLink(FrozenModel):
    between: Annotated[list[DeviceName], Field(min_length=2, max_length=2)]
    bytes_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]


class InferenceProfile(FrozenModel):
    """Everything the inference planner needs; see docs/galaxy.md."""

    format_version: Literal[1] = 1
    kind: Literal["inference"] = "inference"
    source: Literal["preset", "measured"]
    cluster: str
    model: str
    family: Family
    num_layers: PosInt
    """Layers the plans made from this profile run (the model's own count unless `--layers` chose fewer)."""
    hidden: PosInt
    heads: PosInt
    intermediate: PosInt
    dtype_bytes: PosInt = 4
    attention_bytes: NonNegInt
    """M_att: bytes of one layer's attention weights and biases."""
    mlp_bytes: NonNegInt
    """M_mlp: bytes of one layer's MLP weights and biases."""
    embedding_bytes: NonNegInt = 0
    """Token and position embeddings, which every device holds (each embeds the ids itself). Eq. 5
    leaves them out; counting them is what makes GPT2-L (1.55 GB in fp16) miss a 1.5 GB device, as in
    the paper's Table I. 0 reproduces Eq. 5 exactly."""
    devices: Annotated[list[InferenceDevice], Field(min_length=1, max_length=MAX_DEVICES)]
    default_bytes_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    links: list[InferenceLink] = []

    @model_validator(mode="after")
    def _consistent(self) -> "InferenceProfile":
        dupes = duplicates(d.name for d in self.devices)
        if dupes:
            raise ValueError(f"duplicate device names in profile: {listed(dupes)}")
        names = {d.name for d in self.devices}
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        for link in self.links:
            for end in link.between:
                if end not in names:
                    raise ValueError(f"link names unknown device {end!r}")
        return self

    def digest(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def bandwidth_between(self, a: str, b: str) -> float:
        for link in self.links:
            if set(link.between) == {a, b}:
                return link.bytes_per_s
        return self.default_bytes_per_s


class DeviceShare(FrozenModel):
    """One device's part of every layer."""

    device: DeviceName
    heads: NonNegInt
    """a_d: attention heads (sp and local: all of them)."""
    columns: NonNegInt
    """b_d: MLP intermediate columns (sp and local: all of them)."""
    rows: NonNegInt
    """s_d: sequence rows of the connective blocks (megatron, and galaxy on the all-reduce collective:
    every device runs all rows, listed as s)."""
    capacity: NonNegFloat
    """V_d (Eq. 6): 1 / (whole attention + whole MLP block seconds)."""
    memory_bytes: NonNegInt
    """Predicted bytes of this device's layer weights (Eq. 5's left side)."""
    memory_budget_bytes: PosInt


class InferencePrediction(FrozenModel):
    latency_s: NonNegFloat
    """One forward pass of `num_layers` layers (the embeddings and the last gather aside)."""
    compute_s: NonNegFloat
    """Sum over blocks of the slowest device's block time."""
    communication_s: NonNegFloat
    """Synchronization time if nothing overlapped it."""
    exposed_communication_s: NonNegFloat
    """Synchronization time left after the tile overlap (= communication_s without overlap)."""


class InferenceMemoryViolation(FrozenModel):
    device: DeviceName
    needed_bytes: NonNegInt
    budget_bytes: NonNegInt


class InferencePlan(FrozenModel):
    """A collaborative inference plan. Heads, columns and rows are contiguous ranges in share order."""

    format_version: Literal[1] = 1
    kind: Literal["inference"] = "inference"
    strategy: InferenceStrategy
    model: str
    family: Family
    profile_digest: str
    seq_len: PosInt
    num_layers: PosInt
    hidden: PosInt
    heads: PosInt
    intermediate: PosInt
    sync: Literal["reduce-scatter+all-gather", "all-reduce", "kv-all-gather", "none"]
    overlap: bool
    """Tile-based overlap of the ring collectives with the first and last GEMMs (galaxy only): true
    when any of `block_overlap` is."""
    block_overlap: Annotated[list[bool], Field(min_length=4, max_length=4)] | None = None
    """Galaxy: overlapped (true) or plain (false) execution of each of a layer's four ring collectives
    (BLOCK_COLLECTIVES order), the same in every layer (the layers are identical and the profile times
    one). Chosen by the smaller predicted time. None (plans written before): all follow `overlap`."""
    collective: Collective = "ring"
    """Galaxy: `ring` (ReduceScatter + AllGather, sequence-parallel connective blocks) or `all-reduce`
    (gloo's own AllReduce after each block, connective blocks on the whole sequence: Megatron's path
    with galaxy's split; every device's `rows` are then seq_len, as megatron's are; plans written
    before 2026-11-26 list the ring's split there, which nothing runs), whichever is predicted faster."""
    shares: Annotated[list[DeviceShare], Field(min_length=1, max_length=MAX_DEVICES)]
    prediction: InferencePrediction
    own_latency_s: NonNegFloat | None = None
    """Galaxy, where the plan is Megatron's program on Megatron's equal shares because galaxy's own
    plan (Algorithm 1's split, on rings or the AllReduce) was predicted no more than
    EQUAL_SPLIT_MARGIN faster: that own plan's predicted latency, which `hppctl plan` shows beside the
    choice. None where galaxy's own plan runs (and in plans written before 2026-11-28)."""
    memory_violations: list[InferenceMemoryViolation] = []
    """Filled only by the memory-blind baselines (megatron, sp, local): `hppctl run` refuses such a plan."""
    planning_time_s: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _covers(self) -> "InferencePlan":
        twice = duplicates(s.device for s in self.shares)
        if twice:
            raise ValueError(f"a device appears twice in shares: {listed(twice)}")
        heads = [s.heads for s in self.shares]
        columns = [s.columns for s in self.shares]
        rows = [s.rows for s in self.shares]
        if self.strategy in ("galaxy", "megatron"):
            if sum(heads) != self.heads:
                raise ValueError(f"shares hold {sum(heads)} heads, the model has {self.heads}")
            if sum(columns) != self.intermediate:
                raise ValueError(f"shares hold {sum(columns)} MLP columns, the model has {self.intermediate}")
        elif any(h != self.heads or c != self.intermediate for h, c in zip(heads, columns)):
            raise ValueError(f"{self.strategy}: every device holds all {self.heads} heads and {self.intermediate} columns")
        if self.strategy == "megatron":
            if any(r != self.seq_len for r in rows):
                raise ValueError(f"megatron: every device runs all {self.seq_len} rows of the connective blocks")
        elif self.collective == "all-reduce" and all(r == self.seq_len for r in rows):
            pass  # galaxy on Megatron's forward: every device runs every row, listed as megatron's are
        elif sum(rows) != self.seq_len:
            raise ValueError(f"shares hold {sum(rows)} sequence rows, seq_len is {self.seq_len}")
        if self.strategy == "local" and len(self.shares) != 1:
            raise ValueError(f"local runs on one device, got {len(self.shares)}")
        return self._modes()

    def _modes(self) -> "InferencePlan":
        if self.overlap and self.strategy != "galaxy":
            raise ValueError(f"overlap applies to galaxy only, not {self.strategy}")
        if self.strategy != "galaxy" and (self.block_overlap is not None or self.collective != "ring"):
            raise ValueError(f"block_overlap and collective apply to galaxy only, not {self.strategy}")
        if self.block_overlap is not None and any(self.block_overlap) != self.overlap:
            raise ValueError(f"overlap is {str(self.overlap).lower()} but block_overlap is {self.block_overlap}")
        if self.collective == "all-reduce" and self.overlap:
            raise ValueError("the all-reduce collective has no tile overlap: overlap must be false")
        if self.own_latency_s is not None and (self.strategy != "galaxy" or self.collective != "all-reduce"):
            raise ValueError("own_latency_s applies to a galaxy plan on Megatron's program (collective all-reduce)")
        return self

    def overlap_by_block(self) -> tuple[bool, bool, bool, bool]:
        """Overlapped or plain, per collective of a layer (BLOCK_COLLECTIVES order)."""
        if self.block_overlap is not None:
            return tuple(self.block_overlap)  # type: ignore[return-value]
        return (self.overlap,) * 4

    def devices(self) -> list[str]:
        return [s.device for s in self.shares]
