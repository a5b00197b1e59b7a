"""Start a tier-2 test's gloo ranks from a fork server that imported torch once.

`torch.multiprocessing.spawn` starts a fresh interpreter per rank, and each one imported torch
(and torch._dynamo, which meta tensors and the zoo's traces pull in) again: 4-6 s of CPU per rank.
The fork server is started once per test session with those modules loaded, and forks each rank.
The ranks are still separate processes with their own gloo groups; only their start is cheaper.
(`hppctl run`'s own local workers do the same with their zygote, hppctl/runtime/zygote.py.)
"""

from __future__ import annotations

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "hppctl.runtime.stage", "hppctl.runtime.galaxy.device",
           "hppctl.runtime.async_exec.executor", "hppctl.zoo.layers"]


def _forkserver():
    mp.set_forkserver_preload(PRELOAD)  # takes effect when the server starts (the session's first call)
    return mp.get_context("forkserver")


def start_ranks(fn, args: tuple, nprocs: int) -> None:
    """`fn(rank, *args)` in `nprocs` processes; raises if any of them fails (as `mp.spawn` does)."""
    _forkserver()
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def manager():
    """A multiprocessing manager forked from the same server (for results shared with the test)."""
    return _forkserver().Manager()
