"""Where the simulator's durations come from: a profile (per device, per layer range) or the plan alone.

`ProfileTimings` uses the planner's cost model, so the simulator and the closed-form estimate read
the very same per-layer numbers; `PlanTimings` uses only the figures a plan file carries (E_f, E_b,
T_a per stage, transfer time per cut) for `hppctl simulate --plan F` without `--profile`.
"""

from __future__ import annotations

from hppctl.models.plan import HppPlan
from hppctl.models.profile import Profile
from hppctl.models.schedule import Schedule
from hppctl.planner.cost import CostModel, allreduce_buckets
from hppctl.schedule.bipartition import message_bytes, recompute_s, stage_memory


def split_backward_part(kind: str, backward_s: float, weight_s: float) -> float:
    """An `I` takes the backward less its weight gradients, a `W` the weight gradients
    (the head stage's `I` has no input gradient to compute: its W is the whole backward)."""
    weight_s = min(weight_s, backward_s)
    return weight_s if kind == "W" else backward_s - weight_s


class ProfileTimings:
    """Durations and sizes from the profile the plan was made from (what `--profile` selects)."""

    def __init__(self, profile: Profile, schedule: Schedule, *, step_s: float = 0.0, cm: CostModel | None = None):
        """`cm`: the profile's cost model at the schedule's micro-batch, when the caller has it (a cut
        search replays hundreds of schedules of one profile; building it is most of a replay's time)."""
        self.cm = cm if cm is not None else CostModel(profile, micro_batch=schedule.micro_batch,
                                                      num_micro_batches=schedule.num_micro_batches)
        self.cm.check_is_for(profile, schedule.micro_batch, schedule.num_micro_batches)
        self.index = {name: i for i, name in enumerate(self.cm.names)}
        unknown = sorted({d for s in schedule.stages for d in s.devices} - set(self.index))
        if unknown:
            raise ValueError(f"devices {unknown} are not in the profile")
        if schedule.stages[-1].layers[1] > self.cm.num_layers:
            raise ValueError(f"the schedule runs layers up to {schedule.stages[-1].layers[1]}, "
                             f"the profile has {self.cm.num_layers}")
        self.layers = [tuple(s.layers) for s in schedule.stages]
        self.backward = [tuple(s.backward_layers or s.layers) for s in schedule.stages]
        """Bi-Partition stages backward other layers than they forward (docs/bipartition.md)."""
        self.groups = [tuple(self.index[d] for d in s.devices) for s in schedule.stages]
        self._step_s = step_s

    def compute_s(self, device: str, stage: int, kind: str, samples: int) -> float:
        if kind in ("I", "W"):
            whole = self.compute_s(device, stage, "B", samples)
            weight = whole if stage == 0 else self.cm.weight_grad_time(self.index[device], *self.layers[stage], samples)
            return split_backward_part(kind, whole, weight)
        start, end = self.layers[stage] if kind == "F" else self.backward[stage]
        fn = self.cm.forward_time if kind == "F" else self.cm.backward_time
        seconds = fn(self.index[device], start, end, samples)
        if kind == "B" and self.backward[stage] != self.layers[stage]:  # split layers are recomputed
            seconds += recompute_s(self.cm, self.index[device], self.layers[stage], self.backward[stage], samples)
        return seconds

    def action_transfer(self, src: str, dst: str, cut: int, action) -> tuple[int, float]:
        """(bytes, seconds) of one message; each kind crosses its own cut in a Bi-Partition round."""
        nbytes = message_bytes(self.cm, action, self.layers[cut], self.backward[cut])
        return nbytes, nbytes / self.cm.bw[self.index[src]][self.index[dst]]

    def message_bytes(self, cut: int, samples: int) -> int:
        """Bytes of `samples` activations (or their gradients) crossing the cut after stage `cut`."""
        return samples * self.cm.boundary[self.layers[cut][1] - 1]

    def transfer_s(self, src: str, dst: str, cut: int, samples: int) -> float:
        return self.message_bytes(cut, samples) / self.cm.bw[self.index[src]][self.index[dst]]

    def allreduce_s(self, stage: int) -> float:
        start, end = self.layers[stage]
        return self.cm.allreduce_time(self.groups[stage], start, end)

    def allreduce_bytes(self, stage: int) -> int:
        start, end = self.layers[stage]
        return self.cm.param_bytes(start, end)

    def allreduce_buckets(self, stage: int) -> int:
        """The planner's count (`cost.allreduce_buckets`), so both overlap the same way."""
        return allreduce_buckets(self.allreduce_bytes(stage)) if len(self.groups[stage]) > 1 else 1

    def step_s(self, device: str, stage: int) -> float:
        return self._step_s

    def activation_bytes_per_sample(self, stage: int) -> int | None:
        if self.backward[stage] != self.layers[stage]:
            return stage_memory(self.cm, self.groups[stage][0], self.layers[stage], self.backward[stage])[1]
        return self.cm.activation_bytes_per_sample(*self.layers[stage])

    def fixed_bytes(self, stage: int) -> int | None:
        """Weights, gradient accumulator and optimizer state (the K-independent part of Eq. 3)."""
        if self.backward[stage] != self.layers[stage]:  # Bi-Partition: also a split block's recomputation
            return stage_memory(self.cm, self.groups[stage][0], self.layers[stage], self.backward[stage])[0]
        return int(self.cm.fixed_factor * self.cm.param_bytes(*self.layers[stage]))

    def budget_bytes(self, device: str) -> int | None:
        return self.cm.budget[self.index[device]]


class PlanTimings:
    """Durations from the plan file alone: every device of a stage takes the stage's E_f / E_b.

    A transfer of y samples takes y/B of the cut's per-micro-batch time (the plan's figure is the
    whole micro-batch over the slowest link between the two groups). Memory in bytes needs the
    profile (per-sample activation bytes are not in the plan), so it is reported as unknown.
    """

    def __init__(self, plan: HppPlan, *, step_s: float = 0.0):
        self.plan = plan
        self.B = plan.micro_batch
        self._step_s = step_s

    def compute_s(self, device: str, stage: int, kind: str, samples: int) -> float:
        s = self.plan.stages[stage]
        if kind in ("I", "W"):
            if s.weight_grad_s is None:
                raise ValueError(f"the plan's stage {stage} has no weight_grad_s: it cannot replay a split backward")
            return split_backward_part(kind, s.backward_s, s.weight_grad_s)
        return s.forward_s if kind == "F" else s.backward_s

    def message_bytes(self, cut: int, samples: int) -> int:
        return self.plan.transfers[cut].bytes_per_micro_batch * samples // self.B

    def transfer_s(self, src: str, dst: str, cut: int, samples: int) -> float:
        return self.plan.transfers[cut].forward_s * samples / self.B

    def allreduce_s(self, stage: int) -> float:
        return self.plan.stages[stage].allreduce_s

    def allreduce_bytes(self, stage: int) -> int:
        return 0

    def allreduce_buckets(self, stage: int) -> int:
        """The plan's count; 1 (no overlap) for a plan from before it was recorded."""
        return self.plan.stages[stage].allreduce_buckets or 1

    def step_s(self, device: str, stage: int) -> float:
        return self._step_s

    def activation_bytes_per_sample(self, stage: int) -> int | None:
        return None

    def fixed_bytes(self, stage: int) -> int | None:
        return None

    def budget_bytes(self, device: str) -> int | None:
        s = next(s for s in self.plan.stages if device in s.devices)
        return s.memory_budget_bytes[s.devices.index(device)]
