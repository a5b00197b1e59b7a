"""One device's part of a collaborative inference request, timed: what a worker runs once joined.

`run_device` expects the default process group (gloo) to exist already (world = number of devices;
rank = the device's index in the plan's shares) and returns the whole output (`[sequence, hidden]`)
and one `PassTiming` per repeat. The first `warmup` passes are untimed.

`device` (a `torch.device`, runtime/accelerator.py) is where the shard and the ids go and the
forward computes; the ring stages what it sends in host memory (gloo). Clocks are read after
`synchronize(device)`, so a pass's time includes its queued GPU work (nothing to wait for on the CPU).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from collections.abc import Sequence
from typing import Any, Callable

import torch
import torch.distributed as dist

from hppctl.runtime.accelerator import Precision, from_wire, synchronize
from hppctl.runtime.galaxy.hmp import forward, gather_output
from hppctl.runtime.galaxy.ring import Ring


@dataclass
class PassTiming:
    latency_s: float
    """This device's wall time from the common start (a barrier) to holding the whole output."""
    layers_s: float
    """The same up to the end of the last layer (before the output gather)."""
    exposed_comm_s: float
    """Time blocked on transfers or collectives (final gather included)."""
    compute_s: float
    """latency_s - exposed_comm_s: time this device computed (or waited for nothing)."""
    bytes_sent: int
    cpu_s: float
    """Process CPU time of the pass (compute threads and gloo's), for spotting a throttled device."""
    ring_cpu_s: float = 0.0
    """Process CPU of the pass's plain ring collectives, and their bytes sent + received (ring.Stats)."""
    ring_bytes: int = 0
    allreduce_cpu_s: float = 0.0
    """The same for gloo's AllReduce."""
    allreduce_bytes: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def run_device(strategy: str, shard: dict[str, Any], ids: torch.Tensor, rank: int, row_sizes: list[int], *,
               overlap: bool | Sequence[bool], repeats: int = 1, warmup: int = 0, wire_dtype: str = "float32",
               device: torch.device | None = None, precision: Precision | None = None,
               on_pass: Callable[[int, int], None] | None = None,
               collective: str = "ring") -> tuple[torch.Tensor, list[PassTiming]]:
    """on_pass(passes done, passes in all, warm-up included): after each pass (progress reports).
    overlap: one flag, or one per ring collective of a layer (hmp.per_block); collective: galaxy's
    "ring" or "all-reduce" (hmp.forward).
    The output is float32 whatever the precision (what an fp32 run returns)."""
    device = device or torch.device("cpu")
    shard, ids = on_device(shard, device), from_wire(ids, device)
    ring = Ring(rank, row_sizes, wire_dtype=getattr(torch, wire_dtype), device=device)
    timings: list[PassTiming] = []
    output = None
    for n in range(warmup + repeats):
        if ring.world > 1:
            dist.barrier()
        ring.stats.reset()
        synchronize(device)
        cpu, started = time.process_time(), time.perf_counter()
        rows = forward(strategy, shard, ids, ring, overlap=overlap, precision=precision, collective=collective)
        synchronize(device)
        layers_done = time.perf_counter()
        output = gather_output(strategy, rows, ring, collective).float()
        synchronize(device)
        ended = time.perf_counter()
        if n >= warmup:
            timings.append(PassTiming(latency_s=ended - started, layers_s=layers_done - started,
                                      exposed_comm_s=ring.stats.exposed_comm_s,
                                      compute_s=ended - started - ring.stats.exposed_comm_s,
                                      bytes_sent=ring.stats.bytes_sent, cpu_s=time.process_time() - cpu,
                                      ring_cpu_s=ring.stats.ring_cpu_s, ring_bytes=ring.stats.ring_bytes,
                                      allreduce_cpu_s=ring.stats.allreduce_cpu_s,
                                      allreduce_bytes=ring.stats.allreduce_bytes))
        if on_pass is not None:
            on_pass(n + 1, warmup + repeats)
    return output, timings


def on_device(tree: Any, device: torch.device) -> Any:
    """A shard (nested dicts, lists and tuples of tensors and plain values) with its tensors on
    `device`; on the CPU the same tensors."""
    if isinstance(tree, torch.Tensor):
        return from_wire(tree, device)
    if isinstance(tree, dict):
        return {k: on_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(on_device(v, device) for v in tree)
    return tree
