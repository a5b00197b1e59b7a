"""PURE: who is who in a run. Ranks, stages, owned sample ranges and AllReduce groups from a schedule.

Rank order is the schedule's stage order, head first, devices in listed order (the plan's
`HppPlan.devices()`), so rank 0 is the head stage's first device. Every worker computes the same
`Topology` from the same schedule, so no rank map is ever exchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from hppctl.models.schedule import Schedule
from hppctl.schedule.routing import owned_ranges


@dataclass(frozen=True)
class Topology:
    devices: tuple[str, ...]
    """Every device in rank order."""
    stage_of: dict[str, int]
    groups: tuple[tuple[str, ...], ...]
    """Devices of every stage, in listed order."""
    owned: dict[str, tuple[int, int]]
    """Half-open sample range [lo, hi) of every micro-batch each device processes in its stage."""
    samples: dict[str, int]
    num_stages: int
    micro_batch: int
    num_micro_batches: int

    @classmethod
    def of(cls, schedule: Schedule) -> "Topology":
        devices, stage_of, groups, owned, samples = [], {}, [], {}, {}
        for p, stage in enumerate(schedule.stages):
            groups.append(tuple(stage.devices))
            for d, (lo, hi), y in zip(stage.devices, owned_ranges(stage.samples), stage.samples):
                devices.append(d)
                stage_of[d], owned[d], samples[d] = p, (lo, hi), y
        return cls(tuple(devices), stage_of, tuple(groups), owned, samples, len(schedule.stages),
                   schedule.micro_batch, schedule.num_micro_batches)

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.num_micro_batches

    def rank(self, device: str) -> int:
        return self.devices.index(device)

    def group_ranks(self, stage: int) -> list[int]:
        return [self.rank(d) for d in self.groups[stage]]

    def is_head(self, device: str) -> bool:
        return self.stage_of[device] == 0

    def is_tail(self, device: str) -> bool:
        return self.stage_of[device] == self.num_stages - 1

    def replica_index(self, device: str) -> int:
        """Position of `device` in its stage's group; replica 0 writes the stage's checkpoints."""
        return self.groups[self.stage_of[device]].index(device)
