"""Ring collectives over torch.distributed point-to-point, fused with GEMMs tile by tile (§III-D).

Tensors are `[rows, width]` with the sequence in dimension 0 (batch 1). Device i owns rows
`offsets[i] : offsets[i] + sizes[i]` of the sequence; sizes may differ by one row (a sequence
length not divisible by the number of devices), so every receive is sized by the tile it gets.

- `allgather_gemm(x_i, f)`: the ring AllGather that enters a tensor-parallel block, fused with the
  block's first GEMM `f`: in step k device i applies `f` to the tile it holds, tile (i - k) mod D,
  while that tile travels on to its successor and tile (i - k - 1) mod D arrives (the last step
  sends nothing). D GEMM rounds overlap D - 1 communication rounds.
- `gemm_reducescatter(f, width)`: the last GEMM of a block fused with the ring ReduceScatter that
  leaves it: in step k (1..D) device i computes `f` on rows of chunk (i - k) mod D while the partial
  sum finished in step k - 1 travels to its successor; the partial sum arriving from the predecessor
  is added to the fresh tile. After step D device i holds the sum over devices of its own chunk.

`wire_dtype` is what travels: float32 (exact), or float16 (half the bytes, as the paper's fp16 models
send; tiles are converted back on arrival and sums are taken in float32).

With `overlap=False` the same ring runs with the GEMM done whole before (ReduceScatter) or after
(AllGather) the communication: the ablation of the overlap alone, same bytes, same algorithm.
`Stats` accumulates the time this device sat blocked on the network (exposed communication).

On an accelerator (`device`), tiles leave through `accelerator.to_wire` (host memory: gloo) and
arrive through `from_wire`; on the CPU both are the identity.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hppctl.runtime.accelerator import from_wire, pinned_for, to_wire


@dataclass
class Stats:
    exposed_comm_s: float = 0.0
    """Wall time blocked waiting for a transfer or a collective."""
    bytes_sent: int = 0
    messages: int = 0
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    ring_cpu_s: float = 0.0
    """Process CPU (every thread: gloo's too) spent in plain ring collectives, which compute nothing:
    their posts, waits, tile conversions, sums and concatenation (Stats.ring_bytes: sent + received)."""
    ring_bytes: int = 0
    allreduce_cpu_s: float = 0.0
    """The same for gloo's AllReduce (with its dtype conversions); allreduce_bytes: sent + received."""
    allreduce_bytes: int = 0

    def reset(self) -> None:
        self.exposed_comm_s, self.bytes_sent, self.messages = 0.0, 0, 0
        self.ring_cpu_s, self.ring_bytes, self.allreduce_cpu_s, self.allreduce_bytes = 0.0, 0, 0.0, 0


class Ring:
    """One device's view of the ring: rank, world, the row partition, and its blocking time."""

    def __init__(self, rank: int, sizes: list[int], stats: Stats | None = None,
                 wire_dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> None:
        self.rank, self.world, self.sizes = rank, len(sizes), list(sizes)
        self.wire_dtype = wire_dtype
        self.device = device or torch.device("cpu")
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.stats = stats or Stats()
        self._moved = 0  # bytes sent + received by _post, for the CPU accounting of plain collectives

    @property
    def succ(self) -> int:
        return (self.rank + 1) % self.world

    @property
    def pred(self) -> int:
        return (self.rank - 1) % self.world

    def rows(self, j: int) -> slice:
        return slice(self.offsets[j], self.offsets[j] + self.sizes[j])

    # --- point to point ------------------------------------------------------------------------
    def _post(self, send: torch.Tensor, rows: int) -> tuple[list, torch.Tensor]:
        """Start sending `send` to the successor and receiving `rows` rows from the predecessor."""
        wire = to_wire(send.contiguous(), self.wire_dtype)
        recv = torch.empty((rows, *send.shape[1:]), dtype=self.wire_dtype, pin_memory=pinned_for(self.device))
        self.stats.bytes_sent += wire.numel() * wire.element_size()
        self._moved += (wire.numel() + recv.numel()) * recv.element_size()
        self.stats.messages += 1
        return [dist.isend(wire, self.succ), dist.irecv(recv, self.pred)], recv

    def _wait(self, pending: tuple[list, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Block until both transfers are done; the received tile in the compute dtype."""
        started = time.perf_counter()
        for r in pending[0]:
            r.wait()
        self.stats.exposed_comm_s += time.perf_counter() - started
        return from_wire(pending[1], self.device).to(dtype)

    def blocking(self, fn: Callable[[], object]) -> object:
        """Run a blocking collective, counting its time as exposed communication."""
        started = time.perf_counter()
        out = fn()
        self.stats.exposed_comm_s += time.perf_counter() - started
        return out

    # --- fused collectives ---------------------------------------------------------------------
    def allgather_gemm(self, x: torch.Tensor, f: Callable[[torch.Tensor], torch.Tensor], *,
                       overlap: bool) -> torch.Tensor:
        """`f(AllGather(x))` row-wise: `f` must act on rows independently (a GEMM plus bias)."""
        if not overlap:
            return f(self.allgather(x))
        return self._allgather_tiles(x, f)

    def _allgather_tiles(self, x: torch.Tensor, f: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        D, i = self.world, self.rank
        out: list[torch.Tensor | None] = [None] * D
        cur = x
        for k in range(D):
            j = (i - k) % D
            pending = self._post(cur, self.sizes[(i - k - 1) % D]) if k < D - 1 else None
            out[j] = f(cur)  # the GEMM runs while `cur` travels on and the next tile arrives
            if pending is not None:
                cur = self._wait(pending, x.dtype)
        return torch.cat(out)  # tiles in sequence order

    def gemm_reducescatter(self, f: Callable[[slice], torch.Tensor], *, overlap: bool) -> torch.Tensor:
        """Σ over devices of `f(rows)` for this device's own rows; `f(rows)` is this device's
        partial product on those sequence rows (the row-parallel GEMM of a tile)."""
        D, i = self.world, self.rank
        if D == 1:
            return f(self.rows(0))
        if not overlap:
            whole = f(slice(0, sum(self.sizes)))
            return self._counted("ring", lambda: self._reducescatter_tiles(lambda rows: whole[rows]))
        return self._reducescatter_tiles(f)

    def _reducescatter_tiles(self, f: Callable[[slice], torch.Tensor]) -> torch.Tensor:
        D, i = self.world, self.rank
        acc = None
        for k in range(1, D + 1):
            r = (i - k) % D
            pending = self._post(acc, self.sizes[r]) if k >= 2 else None
            tile = f(self.rows(r))  # overlaps the partial sum of step k - 1 on its way
            acc = tile + self._wait(pending, tile.dtype) if pending is not None else tile
        return acc

    def allgather(self, x: torch.Tensor) -> torch.Tensor:
        """Plain ring AllGather of uneven row tiles (D - 1 steps): the fused one with no GEMM."""
        if self.world == 1:
            return x
        return self._counted("ring", lambda: self._allgather_tiles(x, lambda tile: tile))

    def _counted(self, kind: str, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run a collective that computes nothing, adding its process CPU and its bytes sent + received
        to Stats (what the inference profile's comm_cpu_s_per_byte / allreduce_cpu_s_per_byte come from)."""
        cpu, moved = time.process_time(), self._moved
        out = fn()
        spent = time.process_time() - cpu
        if kind == "ring":
            self.stats.ring_cpu_s += spent
            self.stats.ring_bytes += self._moved - moved
        else:
            self.stats.allreduce_cpu_s += spent
            self.stats.allreduce_bytes += self._moved - moved
        return out

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        """Megatron's AllReduce (gloo's own), in place."""
        if self.world > 1:
            self._counted("allreduce", lambda: self._allreduce(x))
        return x

    def _allreduce(self, x: torch.Tensor) -> torch.Tensor:
        wire = to_wire(x, self.wire_dtype)
        moved = 2 * (self.world - 1) * wire.numel() * wire.element_size() // self.world
        self.stats.bytes_sent += moved
        self._moved += 2 * moved  # as much received as sent
        self.stats.messages += 1
        self.blocking(lambda: dist.all_reduce(wire))
        if wire is not x:
            x.copy_(wire)
        return x
