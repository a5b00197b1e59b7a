"""Asteroid's cost model (paper §3.2–3.3, Eqs. 3–11), scalar and easy to check.

This is the reference: every strategy's plan is scored here, and the vectorised dynamic
program in `asteroid.py` is tested against it. Units: seconds, bytes, bytes/s.

A pipeline is a sequence of *steps*: execution steps (stages) at even indices and
communication steps (the cut between two stages) at odd indices, S = 2P - 1 in all.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left
from dataclasses import dataclass

from hppctl.models.profile import Profile


ALLREDUCE_BUCKET_BYTES = 4 * 2**20
"""The runtime's gradient bucket (runtime/reducer.py): the cost model's unit of AllReduce overlap."""


def allreduce_buckets(param_bytes: float) -> int:
    """How many buckets a stage's gradients make (at least one)."""
    return max(1, math.ceil(param_bytes / ALLREDUCE_BUCKET_BYTES))


def exposed_allreduce(total_s: float, backward_s: float, buckets: int) -> float:
    """The part of an AllReduce of `total_s` in `buckets` equal buckets left after the last backward.

    The last micro-batch's backward (`backward_s`) produces bucket k (1..n) at k/n of its length
    and the link sums one bucket at a time, so the last sum ends at max_k [k/n E_b + (n-k+1) T_a/n];
    that is linear in k, so its maximum is at k = 1 or k = n: after the backward's end,
    max(T_a/n, T_a - E_b (1 - 1/n)). One bucket: T_a, all of it exposed (docs/planner.md).
    The same arithmetic as `vector_alloc.exposed_allreduce_many`, so both agree bit for bit.
    """
    return max(total_s / buckets, total_s - backward_s * (1 - 1 / buckets))


@dataclass(frozen=True)
class Step:
    """One step's per-micro-batch forward and backward time, and its AllReduce time (the whole of
    it, in `buckets` buckets: `exposed_allreduce_s` is what the round waits for)."""

    forward_s: float
    backward_s: float
    allreduce_s: float = 0.0
    buckets: int = 1

    @property
    def exposed_allreduce_s(self) -> float:
        if self.allreduce_s == 0.0:
            return 0.0
        return exposed_allreduce(self.allreduce_s, self.backward_s, self.buckets)


@dataclass(frozen=True)
class StageChoice:
    """A stage as the planner chooses it: layers [start, end) on devices (indices) with samples each."""

    start: int
    end: int
    devices: tuple[int, ...]
    samples: tuple[int, ...]


@dataclass(frozen=True)
class Evaluation:
    steps: tuple[Step, ...]
    round_latency_s: float
    dominant_step: int
    memory_bytes: tuple[tuple[int, ...], ...]
    """Per stage, per device: predicted peak memory (Eq. 3)."""
    feasible: bool
    """Every device within its memory budget."""


def asteroid_warmup(num_stages: int, stage: int, num_micro_batches: int) -> int:
    """K_p = min(2(P - p) - 1, M): the paper's 1F1B warm-up depth (p is 0-indexed)."""
    return min(2 * (num_stages - stage) - 1, num_micro_batches)


def classic_warmup(num_stages: int, stage: int, num_micro_batches: int) -> int:
    """K_p = min(P - p, M): PipeDream-Flush / DAPPLE 1F1B."""
    return min(num_stages - stage, num_micro_batches)


def gpipe_warmup(num_stages: int, stage: int, num_micro_batches: int) -> int:
    """All forwards before any backward: every micro-batch is in flight."""
    return num_micro_batches


WARMUP_POLICIES = {"1f1b-asteroid": asteroid_warmup, "1f1b": classic_warmup, "gpipe": gpipe_warmup}


def dominant_step(steps: list[Step] | tuple[Step, ...], m: int) -> int:
    """Closed form of the dominant step: argmax_s M(E_f+E_b)_s + sum_{i<s}(E_f+E_b)_i (first on ties)."""
    best, best_value, prefix = 0, -math.inf, 0.0
    for s, step in enumerate(steps):
        value = m * (step.forward_s + step.backward_s) + prefix
        if value > best_value:
            best, best_value = s, value
        prefix += step.forward_s + step.backward_s
    return best


def round_latency(steps: list[Step] | tuple[Step, ...], m: int) -> float:
    """Eq. (4) in closed form: max_s [C - sum_{i<s} E_b^i + T_a^s], C = T_e^0 (notes §3.3), with
    T_a^s the part of the AllReduce the stage's last backward does not hide (`exposed_allreduce`)."""
    c, prefix = -math.inf, 0.0
    for step in steps:
        c = max(c, m * (step.forward_s + step.backward_s) + prefix)
        prefix += step.forward_s + step.backward_s
    latency, backward_prefix = -math.inf, 0.0
    for step in steps:
        latency = max(latency, c - backward_prefix + step.exposed_allreduce_s)
        backward_prefix += step.backward_s
    return latency


def round_latency_eq456(steps: list[Step] | tuple[Step, ...], m: int) -> tuple[float, int]:
    """Eqs. (4)–(6) literally, with the dominant step grown head-first by Eq. (11).

    Kept beside `round_latency` so a test can show the two agree; the planner uses the
    closed form (it is the same number, computed without the case split).
    """
    # Eq. (11): build the pipeline tail-first, prepending (exec, comm) pairs, and keep the
    # dominant step's aligned value up to date incrementally.
    n = len(steps)
    dm = n - 1
    value = m * (steps[dm].forward_s + steps[dm].backward_s)
    for head in range(n - 3, -1, -2):
        exec_, comm = steps[head], steps[head + 1]
        shift = exec_.forward_s + exec_.backward_s + comm.forward_s + comm.backward_s
        candidates = [
            (value + shift, dm),
            (m * (exec_.forward_s + exec_.backward_s), head),
            (m * (comm.forward_s + comm.backward_s) + exec_.forward_s + exec_.backward_s, head + 1),
        ]
        value, dm = max(candidates, key=lambda c: (c[0], -c[1]))
    e_dm = m * (steps[dm].forward_s + steps[dm].backward_s)
    latency = -math.inf
    for s, step in enumerate(steps):
        t_w = sum(steps[i].forward_s for i in range(s))  # Eq. (5)
        if s < dm:  # Eq. (6)
            t_e = e_dm + sum(steps[i].forward_s + steps[i].backward_s for i in range(s, dm))
        else:
            t_e = e_dm - sum(steps[i].forward_s + steps[i].backward_s for i in range(dm, s))
        latency = max(latency, t_w + t_e + step.exposed_allreduce_s)
    return latency, dm


class CostModel:
    """Per-layer costs of one profile, with prefix sums so any layer range costs O(log grid)."""

    def __init__(self, profile: Profile, *, micro_batch: int, num_micro_batches: int, within_profile: bool = False):
        self.profile = profile
        self.B = micro_batch
        self.M = num_micro_batches
        self.within_profile = within_profile
        self.ceiling = [min(micro_batch, max(d.batch_sizes)) if within_profile else micro_batch
                        for d in profile.devices]
        """Per device, the most samples per micro-batch a plan may give it: B, or with `within_profile`
        (`--micro-batch auto`) at most the largest batch the profile measured the device at, past which
        its times would only be scaled proportionally (a guess; a measured grid stops where memory does)."""
        self.names = [d.name for d in profile.devices]
        self.num_layers = len(profile.layers)
        # One batch grid for all devices (the union): inserting grid points does not change a
        # piecewise-linear curve, and a shared grid is what lets the DP vectorise exactly.
        self.grid = sorted({b for d in profile.devices for b in d.batch_sizes})
        self.budget = [d.memory_bytes for d in profile.devices]
        self._fwd = [_prefix_by_batch(_resample(d.batch_sizes, d.forward_s, self.grid)) for d in profile.devices]
        self._bwd = [_prefix_by_batch(_resample(d.batch_sizes, d.backward_s, self.grid)) for d in profile.devices]
        self._wgt: list[list[list[float]]] | None = None
        """Weight-gradient parts of the backward, built on first use (`weight_grad_time`)."""
        self._param = _prefix([layer.param_bytes for layer in profile.layers])
        self._act = _prefix([layer.activation_bytes_per_sample for layer in profile.layers])
        self.boundary = [layer.boundary_bytes_per_sample for layer in profile.layers]
        self.fixed_factor = 2.0 + profile.optimizer_state_factor
        n = len(self.names)
        self.bw = [[math.inf if a == b else profile.bandwidth_between(self.names[a], self.names[b])
                    for b in range(n)] for a in range(n)]

    @functools.cached_property
    def profile_digest(self) -> str:
        """`Profile.digest` of this model's profile, computed once: it hashes the whole profile (~46 ms
        for efficientnet-b1 on Env C), and a cut search builds hundreds of plans from one cost model."""
        return self.profile.digest()

    def check_is_for(self, profile: Profile, micro_batch: int, num_micro_batches: int) -> None:
        """Raise ValueError unless this is `profile`'s cost model at these micro-batches (a caller that
        hands its own model in, to save building one, must hand the right one)."""
        if self.profile is not profile or self.B != micro_batch or self.M != num_micro_batches:
            raise ValueError("the cost model is not the profile's at the schedule's micro-batches")

    # -- per-layer-range quantities ---------------------------------------------------------
    def _interp(self, device: int, prefix: list[list[float]], start: int, end: int, y: float) -> float:
        """Time of layers [start, end) at batch y: linear between grid points, proportional outside.

        The arithmetic is exactly `LayerTables.times` in vector_alloc.py, so both agree bit for bit.
        """
        return interpolate(self.grid, [row[end] - row[start] for row in prefix], y)

    def forward_time(self, device: int, start: int, end: int, y: float) -> float:
        return self._interp(device, self._fwd[device], start, end, y)

    def backward_time(self, device: int, start: int, end: int, y: float) -> float:
        return self._interp(device, self._bwd[device], start, end, y)

    @property
    def has_weight_grad_times(self) -> bool:
        """Whether every device's profile splits its backward (`DeviceProfile.weight_grad_s`)."""
        return all(d.weight_grad_s is not None for d in self.profile.devices)

    def weight_grad_time(self, device: int, start: int, end: int, y: float) -> float:
        """The part of `backward_time` a split backward defers to its `W` (the rest is its `I`)."""
        if self._wgt is None:
            if not self.has_weight_grad_times:
                lacking = [d.name for d in self.profile.devices if d.weight_grad_s is None]
                raise ValueError(f"the profile has no weight_grad_s for {', '.join(lacking)}: a split backward "
                                 f"needs it (profile again with this version of hppctl)")
            self._wgt = [_prefix_by_batch(_resample(d.batch_sizes, d.weight_grad_s, self.grid))
                         for d in self.profile.devices]
        return self._interp(device, self._wgt[device], start, end, y)

    def param_bytes(self, start: int, end: int) -> int:
        return self._param[end] - self._param[start]

    def activation_bytes_per_sample(self, start: int, end: int) -> int:
        """What one in-flight sample pins on a stage: its layers' saved tensors plus the received input."""
        received = self.boundary[start - 1] if start > 0 else 0
        return self._act[end] - self._act[start] + received

    def memory(self, start: int, end: int, y: int, warmup: int) -> int:
        """Eq. (3): weights + gradient accumulator + optimizer state + K in-flight micro-batches of y samples."""
        fixed = self.fixed_factor * self.param_bytes(start, end)
        return int(fixed + warmup * y * self.activation_bytes_per_sample(start, end))

    def max_samples(self, device: int, start: int, end: int, warmup: int) -> int:
        """Largest y <= the device's ceiling with memory(start, end, y, warmup) <= budget (-1 if even
        the weights do not fit)."""
        spare = self.budget[device] - self.fixed_factor * self.param_bytes(start, end)
        if spare < 0:
            return -1
        per = warmup * self.activation_bytes_per_sample(start, end)
        return self.ceiling[device] if per == 0 else min(self.ceiling[device], int(spare // per))

    def min_bandwidth(self, devices: tuple[int, ...] | list[int]) -> float:
        return min((self.bw[a][b] for a in devices for b in devices if a != b), default=math.inf)

    def allreduce_time(self, devices: tuple[int, ...] | list[int], start: int, end: int) -> float:
        """Eq. (5): ring AllReduce of the stage's gradients over the slowest link of the group."""
        g = len(devices)
        if g <= 1:
            return 0.0
        return 2 * (g - 1) * self.param_bytes(start, end) / (g * self.min_bandwidth(devices))

    def transfer_time(self, cut: int, upstream: tuple[int, ...], downstream: tuple[int, ...]) -> float:
        """One micro-batch's activations across the cut after layer `cut - 1` (gradients: same size)."""
        bw = min(self.bw[a][b] for a in upstream for b in downstream)
        return self.B * self.boundary[cut - 1] / bw

    # -- whole pipelines ---------------------------------------------------------------------
    def stage_step(self, stage: StageChoice) -> Step:
        """Eq. (8): the group waits for its slowest device, separately in forward and backward."""
        fwd = max(self.forward_time(d, stage.start, stage.end, y) for d, y in zip(stage.devices, stage.samples))
        bwd = max(self.backward_time(d, stage.start, stage.end, y) for d, y in zip(stage.devices, stage.samples))
        if len(stage.devices) <= 1:
            return Step(fwd, bwd)
        return Step(fwd, bwd, self.allreduce_time(stage.devices, stage.start, stage.end),
                    allreduce_buckets(self.param_bytes(stage.start, stage.end)))

    def steps(self, stages: list[StageChoice]) -> list[Step]:
        steps: list[Step] = []
        for p, stage in enumerate(stages):
            check_stage(stage)
            steps.append(self.stage_step(stage))
            if p + 1 < len(stages):
                t = self.transfer_time(stage.end, stage.devices, stages[p + 1].devices)
                steps.append(Step(t, t, 0.0))
        return steps

    def evaluate(self, stages: list[StageChoice], schedule: str = "1f1b-asteroid") -> Evaluation:
        warmup = WARMUP_POLICIES[schedule]
        steps = self.steps(stages)
        memory = tuple(
            tuple(self.memory(s.start, s.end, y, warmup(len(stages), p, self.M)) for y in s.samples)
            for p, s in enumerate(stages)
        )
        feasible = all(mem <= self.budget[d] for s, row in zip(stages, memory) for d, mem in zip(s.devices, row))
        latency = round_latency(steps, self.M)
        if math.isnan(latency):  # NaN compares false both ways: it would corrupt every ranking downstream
            raise ValueError(f"round latency is NaN for stages {stages} (steps {steps}); a planner bug")
        return Evaluation(tuple(steps), latency, dominant_step(steps, self.M), memory, feasible)


def check_stage(stage: StageChoice) -> None:
    """A stage every strategy must produce: some devices, one sample count each.

    A malformed stage is a planner bug; say so here rather than fail later as arithmetic
    (DAPPLE's 0 * inf = NaN once came out as `max() arg is an empty sequence`).
    """
    if not stage.devices or len(stage.devices) != len(stage.samples):
        raise ValueError(f"a planner produced a stage without devices or with misaligned samples: {stage}")


def _prefix(values: list[float]) -> list[float]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _prefix_by_batch(per_layer: list[list[float]]) -> list[list[float]]:
    """per_layer[layer][grid] -> prefix[grid][layer + 1]."""
    width = len(per_layer[0]) if per_layer else 0
    return [_prefix([row[k] for row in per_layer]) for k in range(width)]


def interpolate(grid: list[int], values: list[float], y: float) -> float:
    """Piecewise-linear in y between grid points; proportional to y below and above the grid."""
    if y <= 0:
        return 0.0
    k = bisect_left(grid, y)
    if k < len(grid) and grid[k] == y:
        return values[k]
    if k == 0:
        return values[0] * y / grid[0]
    if k == len(grid):
        return values[-1] * y / grid[-1]
    lo, hi = grid[k - 1], grid[k]
    return values[k - 1] + (values[k] - values[k - 1]) * (y - lo) / (hi - lo)


def _resample(batch_sizes: list[int], per_layer: list[list[float]], grid: list[int]) -> list[list[float]]:
    if list(batch_sizes) == grid:
        return per_layer
    return [[interpolate(list(batch_sizes), row, b) for b in grid] for row in per_layer]
