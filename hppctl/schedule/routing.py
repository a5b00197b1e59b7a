"""Sample routing between stages with uneven allocations (notes §4, "route samples by index").

Within a micro-batch of B samples the devices of a stage own consecutive index ranges in listed
order. A sender sends the intersection of its range with each receiver's range; gradients go
back along the same pairs, so every sample's backward runs where its forward ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Route:
    """Samples [start, end) of every micro-batch cross from `src` (stage p) to `dst` (stage p+1)."""

    src: str
    dst: str
    start: int
    end: int

    @property
    def samples(self) -> int:
        return self.end - self.start


def owned_ranges(samples: Sequence[int]) -> list[tuple[int, int]]:
    """[3, 0, 5] -> [(0, 3), (3, 3), (3, 8)]: consecutive half-open ranges, empty where a device has 0."""
    out, start = [], 0
    for y in samples:
        out.append((start, start + y))
        start += y
    return out


def routes(upstream: Sequence[str], up_samples: Sequence[int],
           downstream: Sequence[str], down_samples: Sequence[int]) -> list[Route]:
    """Every non-empty intersection of an upstream range with a downstream range, in index order.

    A two-pointer sweep: O(|upstream| + |downstream|) routes at most.
    """
    up, down = owned_ranges(up_samples), owned_ranges(down_samples)
    out: list[Route] = []
    i = j = 0
    while i < len(up) and j < len(down):
        lo, hi = max(up[i][0], down[j][0]), min(up[i][1], down[j][1])
        if lo < hi:
            out.append(Route(upstream[i], downstream[j], lo, hi))
        if up[i][1] <= down[j][1]:
            i += 1
        else:
            j += 1
    return out
