"""One device's part of a collaborative inference request, timed: what a worker runs once joined.

`run_device` expects the default process group (gloo) to exist already (world = number of devices;
rank = the device's index in the plan's shares) and returns the whole output (`[sequence, hidden]`)
and one `PassTiming` per repeat. The first `warmup` passes are untimed.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

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

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def run_device(strategy: str, shard: dict[str, Any], ids: torch.Tensor, rank: int, row_sizes: list[int], *,
               overlap: bool, repeats: int = 1, warmup: int = 0, wire_dtype: str = "float32",
               on_pass: Callable[[int, int], None] | None = None) -> tuple[torch.Tensor, list[PassTiming]]:
    """on_pass(passes done, passes in all, warm-up included): after each pass (progress reports)."""
    ring = Ring(rank, row_sizes, wire_dtype=getattr(torch, wire_dtype))
    timings: list[PassTiming] = []
    output = None
    for n in range(warmup + repeats):
        if ring.world > 1:
            dist.barrier()
        ring.stats.reset()
        cpu, started = time.process_time(), time.perf_counter()
        rows = forward(strategy, shard, ids, ring, overlap=overlap)
        layers_done = time.perf_counter()
        output = gather_output(strategy, rows, ring)
        ended = time.perf_counter()
        if n >= warmup:
            timings.append(PassTiming(latency_s=ended - started, layers_s=layers_done - started,
                                      exposed_comm_s=ring.stats.exposed_comm_s,
                                      compute_s=ended - started - ring.stats.exposed_comm_s,
                                      bytes_sent=ring.stats.bytes_sent, cpu_s=time.process_time() - cpu))
        if on_pass is not None:
            on_pass(n + 1, warmup + repeats)
    return output, timings
