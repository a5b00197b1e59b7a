"""CPU seconds a device spends per byte of communication: what the inference planner charges a device
without a spare core (docs/galaxy.md, "Why the overlap did not pay").

    comm_cpu_record(rows=95, hidden=1024)
    # {"type": "comm_cpu", "ring_s_per_byte": 1.9e-09, "allreduce_s_per_byte": 1.1e-09, ...}

Two gloo process groups in this one process, joined over loopback through an in-memory store (no
peer, no network: the probe runs on one device), move data between themselves, and the process's
CPU time (every thread: the Python side and gloo's I/O threads) is divided by the bytes sent plus
received:

- `ring`: the steps of galaxy's ring (runtime/galaxy/ring.py): an fp32 tile converted to fp16,
  `send` to the other group while it `recv`s, waited for and converted back;
- `allreduce`: gloo's own `all_reduce` of a `[rows * 3, hidden]` fp16 tensor on both groups at once
  (two threads), Megatron's collective.

Loopback skips the NIC driver and shaping, so a real link costs somewhat more; measured inside the
device's cgroup, the figures are its CPU at its own speed, which is what the planner divides by
the device's share of a core.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any


def loopback_pair() -> list[Any]:
    """Two gloo process groups of one world of two, both in this process, on the loopback interface."""
    import torch.distributed as dist

    store = dist.HashStore()
    groups: list[Any] = [None, None]
    errors: list[BaseException] = []

    def join(rank: int) -> None:
        try:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = datetime.timedelta(seconds=60)
            opts._devices = [dist.ProcessGroupGloo.create_device(interface="lo")]
            groups[rank] = dist.ProcessGroupGloo(store, rank, 2, opts)
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return groups


def ring_cpu_s_per_byte(groups: list[Any], rows: int, hidden: int, steps: int) -> float:
    import torch

    tile = torch.randn(rows, hidden)
    recv = torch.empty(rows, hidden, dtype=torch.float16)

    def step() -> None:
        wire = tile.to(torch.float16)
        sent, got = groups[0].send([wire], 1, 0), groups[1].recv([recv], 0, 0)
        sent.wait()
        got.wait()
        recv.to(torch.float32)

    step()  # connections and buffers
    started = time.process_time()
    for _ in range(steps):
        step()
    moved = steps * 2 * rows * hidden * 2  # fp16 bytes sent + received
    return (time.process_time() - started) / moved


def allreduce_cpu_s_per_byte(groups: list[Any], rows: int, hidden: int, steps: int) -> float:
    import torch

    tensors = [torch.randn(3 * rows, hidden).to(torch.float16) for _ in range(2)]

    def reduce(rank: int, n: int) -> None:
        for _ in range(n):
            groups[rank].allreduce([tensors[rank]]).wait()

    def both(n: int) -> None:
        threads = [threading.Thread(target=reduce, args=(r, n)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    both(1)
    started = time.process_time()
    both(steps)
    # world of two: each group sends and receives the whole tensor (half in the reduce-scatter, half
    # in the all-gather), so the pair moves 4x its bytes in sends plus receives
    moved = steps * 4 * tensors[0].numel() * 2
    return (time.process_time() - started) / moved


def comm_cpu_record(rows: int, hidden: int, steps: int = 8, rounds: int = 5) -> dict[str, Any]:
    """The probe's `comm_cpu` record for tiles of `rows` x `hidden` (galaxy's ring tile at the
    profiled length on three devices): the least of `rounds` rounds (page faults and cache misses of
    a round only ever add CPU)."""
    groups = loopback_pair()
    ring = min(ring_cpu_s_per_byte(groups, rows, hidden, steps) for _ in range(rounds))
    reduce = min(allreduce_cpu_s_per_byte(groups, rows, hidden, max(2, steps // 3)) for _ in range(rounds))
    return {"type": "comm_cpu", "rows": rows, "hidden": hidden, "ring_s_per_byte": ring,
            "allreduce_s_per_byte": reduce}
