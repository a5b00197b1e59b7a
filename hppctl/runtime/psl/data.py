"""Each client's data shard, its sample order, and the FedAvg weights that follow from the shards.

The training split is dealt out once per run: a permutation drawn from the run's seed, cut into one
contiguous slice per client, sized by `--shares` (equal by default; largest remainders go to the
first clients). A client keeps only its slice (on a real deployment the shard is the device's own
data; the built-in datasets are generated identically everywhere, so each client cuts its slice
out). Batch `step` of a client is positions [step·B, (step+1)·B) of its shard's epoch permutation,
drawn from (seed, client index, epoch) with `runtime.data.SampleOrder`, so a single-process
reference reads exactly the same samples.

FedAvg (McMahan et al., the aggregation the paper names) weighs client j's model by n_j / Σ n, its
share of the training samples.
"""

from __future__ import annotations

import torch

from hppctl.errors import BadInput
from hppctl.runtime.data import SampleOrder
from hppctl.schedule.routing import owned_ranges

_SHARD_SEED_OFFSET = 7_919
"""Keeps the shard permutation apart from the sample orders drawn from the same seed."""


def shard_sizes(num_samples: int, shares: list[float]) -> list[int]:
    total = sum(shares)
    exact = [num_samples * s / total for s in shares]
    sizes = [int(e) for e in exact]
    by_remainder = sorted(range(len(shares)), key=lambda j: (-(exact[j] - sizes[j]), j))
    for j in by_remainder[:num_samples - sum(sizes)]:
        sizes[j] += 1
    return sizes


def shards(num_samples: int, shares: list[float], seed: int) -> list[torch.Tensor]:
    """Dataset indices of every client's shard, in client order."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + _SHARD_SEED_OFFSET)
    perm = torch.randperm(num_samples, generator=gen)
    return [perm[first:end] for first, end in owned_ranges(shard_sizes(num_samples, shares))]


def check_shards(num_samples: int, shares: list[float], batch: int, clients: list[str]) -> None:
    for client, size in zip(clients, shard_sizes(num_samples, shares)):
        if size < batch:
            raise BadInput(f"--shares: client {client!r} gets {size} of the {num_samples} training samples, "
                           f"fewer than the plan's batch {batch}")


def fedavg_weights(num_samples: int, shares: list[float]) -> list[float]:
    sizes = shard_sizes(num_samples, shares)
    return [n / sum(sizes) for n in sizes]


class ClientSamples:
    """Which dataset samples client `index` trains on at every batch step."""

    def __init__(self, shard: torch.Tensor, batch: int, seed: int, index: int) -> None:
        self.shard = shard
        self.order = SampleOrder(len(shard), batch, batch, seed * 1_009 + index)

    def indices(self, step: int) -> torch.Tensor:
        return self.shard[self.order.indices(step, 0, 0, self.order.global_batch)]
