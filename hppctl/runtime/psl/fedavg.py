"""FedAvg at the end of a round, over gloo: every client's whole model becomes the weighted average.

Client j's model is its part 1 and part 3 (on the client) and its part-2 copy (on its helper);
with per-client cuts the parts differ between clients, but every tensor of the whole model is in
exactly one part of each client. So each device contributes w_j · θ for every tensor it holds for
client j (a client its parts 1 and 3, a helper each of its part-2 copies), the contributions are
summed over the devices holding that tensor, and each of them copies the sum — the average, since
the weights w_j = n_j / Σ n (psl/data.py) sum to 1 — back into every copy it holds.

Only holders exchange a tensor: tensors are grouped by the set of ranks holding them (with one cut
for all clients: the clients for parts 1 and 3, the helpers for part 2), and each group is summed
by an AllReduce in a gloo group of exactly those ranks (nothing to exchange when one rank holds
them all, say one helper serving every client). A device therefore moves only its own parts,
rather than the whole model through every rank.

What is averaged: the floating-point entries of the model's state dict (parameters and BatchNorm
running statistics). Integer buffers (`num_batches_tracked`) are equal on every client (each makes
the same number of batch updates) and stay as they are. Optimizer state (momentum, Adam moments)
stays with each copy, as in FedAvg's local solvers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from hppctl.runtime.executor import BUCKET_BYTES
from hppctl.runtime.psl.topology import PslTopology

Holding = tuple[float, torch.nn.Module]
"""(w_j, a module holding some of client j's tensors under the whole model's names)."""


@dataclass(frozen=True)
class HolderGroup:
    ranks: tuple[int, ...]
    """Every rank holding these tensors (a gloo group when more than one)."""
    tensors: tuple[tuple[str, torch.Size], ...]
    """Name and shape, in the whole model's state-dict order."""


def holder_groups(topo: PslTopology, model: str, granularity: str, num_layers: int) -> list[HolderGroup]:
    """The floating state entries of the whole model grouped by the ranks holding them; the same
    list, in the same order, on every rank (built on the meta device: no memory, no randomness)."""
    from hppctl.zoo import build_stage, get_model

    whole = get_model(model).build(device="meta").train()
    names = {r: {k for k, v in build_stage(whole, granularity, *r, mode="train").state_dict().items()}
             for r in topo.part_ranges(num_layers)}
    holders: dict[str, set[int]] = {}
    for client in topo.clients:
        s1, s2 = topo.cuts[client]
        on = {(0, s1): client, (s1, s2): topo.helper_of[client], (s2, num_layers): client}
        for part, device in on.items():
            for name in names[part]:
                holders.setdefault(name, set()).add(topo.rank(device))
    grouped: dict[tuple[int, ...], list[tuple[str, torch.Size]]] = {}
    for name, value in whole.state_dict().items():
        if value.dtype.is_floating_point and name in holders:
            grouped.setdefault(tuple(sorted(holders[name])), []).append((name, value.shape))
    return [HolderGroup(ranks, tuple(tensors)) for ranks, tensors in sorted(grouped.items())]


def _buckets(tensors) -> list[list[tuple[str, torch.Size]]]:
    out, current, size = [], [], 0
    for name, shape in tensors:
        current.append((name, shape))
        size += shape.numel() * 4
        if size >= BUCKET_BYTES:
            out.append(current)
            current, size = [], 0
    return out + ([current] if current else [])


def fedavg(groups: list[HolderGroup], holdings: list[Holding], rank: int,
           allreduce_sum: Callable[[torch.Tensor, HolderGroup], None]) -> None:
    """Replace every held tensor by the clients' weighted average. Every rank calls this with the
    same `groups`; it takes part in the groups holding its rank, one AllReduce per bucket."""
    states = [(w, module.state_dict(keep_vars=True)) for w, module in holdings]
    for group in groups:
        if rank not in group.ranks:
            continue
        for bucket in _buckets(group.tensors):
            offsets, total = {}, 0
            for name, shape in bucket:
                offsets[name] = (total, shape)
                total += shape.numel()
            flat = torch.zeros(total, dtype=torch.float32)
            for w, state in states:
                for name, (first, shape) in offsets.items():
                    if name in state:
                        flat[first:first + shape.numel()] += w * state[name].detach().reshape(-1).float()
            if len(group.ranks) > 1:
                allreduce_sum(flat, group)
            with torch.no_grad():
                for _, state in states:
                    for name, (first, shape) in offsets.items():
                        if name in state:
                            state[name].copy_(flat[first:first + shape.numel()].view(shape))
