"""FedAvg at the end of a round, over gloo: every client's whole model becomes the weighted average.

Client j's model is its part 1 and part 3 (on the client) and its part-2 copy (on its helper);
with per-client cuts the parts differ between clients, but every parameter of the whole model is
in exactly one part of each client. So each device contributes w_j · θ for every tensor it holds for
client j (a client its parts 1 and 3, a helper each of its part-2 copies), one SUM AllReduce over
the whole model's tensors adds the contributions of all clients, and each device copies the
average back into every tensor it holds. Weights w_j = n_j / Σ n (psl/data.py) sum to 1.

What is averaged: the floating-point entries of the model's state dict (parameters and BatchNorm
running statistics). Integer buffers (`num_batches_tracked`) are equal on every client (each makes
the same number of batch updates) and stay as they are. Optimizer state (momentum, Adam moments)
stays with each copy, as in FedAvg's local solvers.
"""

from __future__ import annotations

from typing import Callable

import torch

from hppctl.runtime.executor import BUCKET_BYTES

Holding = tuple[float, torch.nn.Module]
"""(w_j, a module holding some of client j's tensors under the whole model's names)."""


def model_layout(model: str) -> list[tuple[str, torch.Size]]:
    """Name and shape of every floating entry of the whole model's state dict (built on meta: no memory)."""
    from hppctl.zoo import get_model

    whole = get_model(model).build(device="meta")
    return [(k, v.shape) for k, v in whole.state_dict().items() if v.dtype.is_floating_point]


def _buckets(layout: list[tuple[str, torch.Size]]) -> list[list[tuple[str, torch.Size]]]:
    out, current, size = [], [], 0
    for name, shape in layout:
        current.append((name, shape))
        size += shape.numel() * 4
        if size >= BUCKET_BYTES:
            out.append(current)
            current, size = [], 0
    return out + ([current] if current else [])


def fedavg(layout: list[tuple[str, torch.Size]], holdings: list[Holding],
           allreduce_sum: Callable[[torch.Tensor], None]) -> None:
    """Replace every held tensor by the clients' weighted average; every rank calls this with the
    same `layout` (one AllReduce per bucket, in the same order everywhere)."""
    states = [(w, module.state_dict(keep_vars=True)) for w, module in holdings]
    for bucket in _buckets(layout):
        offsets, total = {}, 0
        for name, shape in bucket:
            offsets[name] = (total, shape)
            total += shape.numel()
        flat = torch.zeros(total, dtype=torch.float32)
        for w, state in states:
            for name, (first, shape) in offsets.items():
                if name in state:
                    flat[first:first + shape.numel()] += w * state[name].detach().reshape(-1).float()
        allreduce_sum(flat)
        with torch.no_grad():
            for _, state in states:
                for name, (first, shape) in offsets.items():
                    if name in state:
                        state[name].copy_(flat[first:first + shape.numel()].view(shape))
