"""Run inference cases on D gloo processes (forked by tests/ranks.py); imported by the children (torch only, no transformers).

`run_cases(world, cases)` starts `world` processes; each case is (strategy, overlap, weights, heads,
columns, rows, ids[, wire dtype[, precision]]) and every process runs all of them in order, so one
spawn covers many cases. `overlap` is one flag or four (per ring collective); strategy
"galaxy/all-reduce" is galaxy's split on gloo's AllReduce (the plan's `collective: all-reduce`). The precision (fp32, fp16, bf16) runs on the CPU device.
Returns rank 0's whole output per case.
"""

from __future__ import annotations

import datetime
import os
import tempfile

import torch
import torch.distributed as dist

from hppctl.runtime.accelerator import Precision
from hppctl.runtime.galaxy.device import run_device
from hppctl.runtime.galaxy.weights import device_shard
from hppctl.schedule.routing import owned_ranges
from tests.ranks import manager, start_ranks


def _child(rank: int, world: int, init_file: str, cases: list, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for n, (strategy, overlap, weights, heads, columns, rows, ids, *extra) in enumerate(cases):
            wire, precision = (list(extra) + ["float32", "fp32"][len(extra):])[:2]
            if strategy in ("sp", "local"):
                shard = device_shard(weights, (0, weights["meta"]["heads"]), (0, weights["layers"][0]["w1"].shape[0]))
            else:
                shard = device_shard(weights, owned_ranges(heads)[rank], owned_ranges(columns)[rank])
            strategy, _, collective = strategy.partition("/")
            out, _ = run_device(strategy, shard, ids, rank, rows, overlap=overlap, wire_dtype=wire,
                                device=torch.device("cpu"), precision=Precision(precision, "cpu"),
                                collective=collective or "ring")
            if rank == 0:
                results[n] = out.clone()
    finally:
        dist.destroy_process_group()


def run_cases(world: int, cases: list) -> list[torch.Tensor]:
    with tempfile.TemporaryDirectory() as tmp, manager() as shared:
        results = shared.dict()
        start_ranks(_child, (world, os.path.join(tmp, "init"), cases, results), world)
        return [results[n] for n in range(len(cases))]
