"""Bucketed gradient AllReduce of a replicated stage, overlapped with the round's last backward.

Gradients accumulate over a round's micro-batches, so only the device's last backward of the round
produces final gradients: during it (and only then) a post-accumulate-grad hook on every parameter
marks the parameter ready, and each bucket whose parameters are all ready is flattened and its
AllReduce started asynchronously, while autograd goes on with the earlier layers (what DDP's
reducer does on its last micro-batch, outside `no_sync`). `AR` then waits for those, starts the
rest and copies the sums back (`finish`).

Order. gloo pairs the collectives of a group by the order they are issued, so every member must
issue the same bucket sequence whatever its samples: the buckets are fixed at construction from the
parameter list in reverse (the order backward produces gradients, as DDP's reducer assumes) and
bucket k starts only once it is complete *and* buckets 0..k-1 have started. A device with no
samples, or a parameter its samples never reach, leaves buckets incomplete; `finish` starts them in
the same order, the missing gradients as zeros (as the synchronous path always did).

Failures inside a hook (a lost peer while posting) are kept and raised by `finish`, at the `AR`
action, so the fault-tolerant worker sees its own exception types rather than autograd's wrapping.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import torch

from hppctl.planner.cost import ALLREDUCE_BUCKET_BYTES as BUCKET_BYTES
from hppctl.runtime.accelerator import to_wire

# BUCKET_BYTES, the AllReduce granularity: big enough to keep gloo's per-call cost small, small enough
# that the flattened copy adds little to a stage's peak memory and the first bucket is ready early in
# the last backward. The planner's cost model counts buckets of the same size (planner/cost.py).


class Work(Protocol):
    def wait(self) -> object: ...
    def is_completed(self) -> bool: ...


class ReduceComm(Protocol):
    def allreduce_sum(self, tensor: torch.Tensor) -> None: ...
    def allreduce_sum_async(self, tensor: torch.Tensor) -> Work: ...


@dataclass
class Launched:
    """One bucket's AllReduce in flight: its flattened copy and when it started and ended."""

    bucket: int
    flat: torch.Tensor
    work: Work | None
    """None: reduced synchronously (overlap off)."""
    started: float
    ended: list[float] = field(default_factory=list)
    """Completion time, filled by the work's future callback (gloo thread) or at the wait."""


def plan_buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Indices of `params` in reverse order, cut into buckets of at least `bucket_bytes` (the last
    may be smaller): a function of the stage's parameter shapes only, so the same on every replica."""
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(params))):
        current.append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= bucket_bytes:
            out.append(current)
            current, size = [], 0
    if current:
        out.append(current)
    return out


class GradientReducer:
    """Sums a stage's gradients over its group, bucket by bucket, from the last backward's hooks."""

    def __init__(self, params: list[torch.nn.Parameter], comm: ReduceComm, *, bucket_bytes: int = BUCKET_BYTES,
                 overlap: bool = True) -> None:
        self.params, self.comm = list(params), comm
        self.buckets = plan_buckets(self.params, bucket_bytes)
        self.bucket_of = {i: k for k, bucket in enumerate(self.buckets) for i in bucket}
        self.overlap = overlap and hasattr(comm, "allreduce_sum_async")
        self._reset()

    def _reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.missing = [len(b) for b in self.buckets]
        self.launched: list[Launched] = []
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        """Hooks run on autograd's threads (one per accelerator); launches must stay in order."""

    @contextmanager
    def hooked(self) -> Iterator[None]:
        """Around the round's last backward: start each bucket's AllReduce as soon as it is complete.

        The hooks live only for this backward (no hook outlives the executor that registered it)."""
        self._reset()
        if not self.overlap:
            yield
            return
        handles = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(self.params)
                   if p.requires_grad]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def ready(_param: torch.Tensor) -> None:
            with self.lock:
                if self.ready[i] or self.error is not None:
                    return
                self.ready[i] = True
                self.missing[self.bucket_of[i]] -= 1
                try:
                    self._launch_complete()
                except BaseException as e:  # raised by `finish`, at the AR action
                    self.error = e
        return ready

    def _launch_complete(self) -> None:
        while len(self.launched) < len(self.buckets) and self.missing[len(self.launched)] == 0:
            self._launch(len(self.launched))

    def _launch(self, k: int) -> None:
        grads = [self.params[i].grad for i in self.buckets[k]]
        flat = to_wire(torch.cat([g.reshape(-1) for g in grads]))
        started = time.perf_counter()
        if not self.overlap:
            self.comm.allreduce_sum(flat)
            self.launched.append(Launched(k, flat, None, started, [time.perf_counter()]))
            return
        work = self.comm.allreduce_sum_async(flat)
        launched = Launched(k, flat, work, started)
        future = getattr(work, "get_future", None)
        if future is not None:  # torch's Work: the completion time as gloo sees it
            future().add_done_callback(lambda _f, ended=launched.ended: ended.append(time.perf_counter()))
        self.launched.append(launched)

    def finish(self) -> list[Launched]:
        """Start what the last backward left (zeros for gradients that never came), wait for every
        bucket in order and copy the sums into the gradients. Returns the buckets, for the trace."""
        with self.lock:
            if self.error is not None:
                error, self.error = self.error, None
                raise error
            for p in self.params:
                if p.grad is None:  # a device with no samples (or a parameter its samples did not reach)
                    p.grad = torch.zeros_like(p)
            while len(self.launched) < len(self.buckets):
                self._launch(len(self.launched))
            launched = self.launched
        for b in launched:
            if b.work is not None:
                b.work.wait()
                if not b.ended:
                    b.ended.append(time.perf_counter())
            unflatten_into(b.flat, [self.params[i].grad for i in self.buckets[b.bucket]])
        self._reset()  # the next round starts from nothing, with or without a backward of its own
        return launched


def unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy `flat`'s pieces into `tensors` (from host memory onto their device, if they live on one)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n
