"""Small readable schedules and timings for the schedule tests."""

from __future__ import annotations

from hppctl.models.schedule import Schedule, ScheduleStage
from hppctl.schedule import Durations, generate, warmups


def make_stages(groups: list[list[int]], M: int, policy: str = "1f1b-asteroid", ks: list[int] | None = None):
    """groups[p] = samples per device of stage p (devices d0, d1, … numbered head first)."""
    ks = ks or warmups(policy, len(groups), M)
    stages, n = [], 0
    for p, samples in enumerate(groups):
        devices = [f"d{n + i}" for i in range(len(samples))]
        n += len(samples)
        stages.append(ScheduleStage(layers=[p, p + 1], devices=devices, samples=list(samples), warmup=ks[p]))
    return stages


def make_schedule(groups: list[list[int]], M: int, policy: str = "1f1b-asteroid", ks: list[int] | None = None,
                  durations: Durations | None = None, split_backward: bool = False) -> Schedule:
    return generate(make_stages(groups, M, policy, ks), micro_batch=sum(groups[0]), num_micro_batches=M,
                    policy=policy, durations=durations, split_backward=split_backward)


class FixedTimings:
    """Per-stage forward/backward seconds (whatever the samples), per-cut seconds per micro-batch of B samples."""

    def __init__(self, forward, backward, transfer=(), *, B: int = 8, allreduce=None, step_s: float = 0.0,
                 activation_bytes: int = 100, bandwidth=None, buckets=None, weight=None):
        self.f, self.b, self.c, self.B = list(forward), list(backward), list(transfer), B
        self.w = list(weight or [x / 2 for x in self.b])
        """Split backwards: each stage's W seconds (the head's W is its whole backward, its I nothing)."""
        self.ar = list(allreduce or [0.0] * len(self.f))
        self.buckets = list(buckets or [1] * len(self.f))
        self._step, self.act, self.bandwidth = step_s, activation_bytes, bandwidth or {}

    def compute_s(self, device, stage, kind, samples):
        if kind in ("I", "W"):
            weight = self.b[stage] if stage == 0 else self.w[stage]
            return weight if kind == "W" else self.b[stage] - weight
        return (self.f if kind == "F" else self.b)[stage]

    def message_bytes(self, cut, samples):
        return samples * 1000

    def transfer_s(self, src, dst, cut, samples):
        if (src, dst) in self.bandwidth:
            return self.message_bytes(cut, samples) / self.bandwidth[(src, dst)]
        return self.c[cut] * samples / self.B

    def allreduce_s(self, stage):
        return self.ar[stage]

    def allreduce_bytes(self, stage):
        return 0

    def allreduce_buckets(self, stage):
        return self.buckets[stage]

    def step_s(self, device, stage):
        return self._step

    def activation_bytes_per_sample(self, stage):
        return self.act

    def fixed_bytes(self, stage):
        return 0

    def budget_bytes(self, device):
        return None
