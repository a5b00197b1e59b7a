"""A hybrid-pipeline plan: which layers each stage runs, on which devices, with how many samples.

Stages are ordered head (index 0) to tail. `layers` is half-open `[start, end)`.
`samples[i]` is how many samples of every micro-batch `devices[i]` processes in that stage;
within a micro-batch of B samples the devices of a stage own consecutive index ranges in
the order listed (device 0 owns [0, samples[0]), device 1 the next samples[1], …).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from hppctl.limits import MAX_DEVICES, MAX_LAYERS, MAX_MICRO_BATCHES
from hppctl.models.base import FrozenModel, duplicates, listed
from hppctl.models.cluster import DeviceName
from hppctl.models.profile import Granularity, ModelInput, NonNegFloat, TimeS, _OmitsUnset

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
LayerIndex = Annotated[int, Field(ge=0, le=MAX_LAYERS)]
MicroBatches = Annotated[int, Field(gt=0, le=MAX_MICRO_BATCHES)]
"""Micro-batches per round: the simulator and the schedule reports grow with them (10⁶ hung)."""

Strategy = str
"""Name of a registered planning strategy (`asteroid`, `asteroid-paper`, `dp`, `pp`, `pipedream`, `dapple`)."""


class StagePlan(_OmitsUnset):
    _omit_when_default = ("backward_layers", "allreduce_exposed_s", "allreduce_buckets", "weight_grad_s",
                          "in_flight_cap")

    layers: Annotated[list[LayerIndex], Field(min_length=2, max_length=2)]
    """Half-open layer range [start, end) (of the forward pass when `backward_layers` is set)."""
    devices: Annotated[list[DeviceName], Field(min_length=1, max_length=MAX_DEVICES)]
    samples: Annotated[list[NonNegInt], Field(min_length=1)]
    """Samples of each micro-batch per device (aligned with `devices`, summing to B)."""
    warmup: PosInt
    """K_p: forwards this stage runs before strict one-forward-one-backward."""
    forward_s: TimeS
    """E_f: one micro-batch's forward on this stage (slowest device)."""
    backward_s: TimeS
    weight_grad_s: TimeS | None = None
    """Split-backward plans (`HppPlan.split_backward`): the part of `backward_s` the deferred `W`
    takes (the whole of it on the head stage, which has no input gradient to hurry)."""
    in_flight_cap: PosInt | None = None
    """Split-backward plans: most micro-batches whose activations the stage holds at once (forwarded,
    `W` not yet run), >= `warmup`; how far Ws may be deferred. `memory_bytes` counts this many."""
    allreduce_s: TimeS
    """T_a: the whole AllReduce of the stage's gradients over its group (Eq. 5)."""
    allreduce_exposed_s: TimeS | None = None
    """The part of T_a the stage's last backward does not hide (docs/planner.md, "AllReduce
    overlap"), what the round latency counts; None (left out of the file): a stage on one device,
    or a plan from before the overlap, whose latency counted all of T_a."""
    allreduce_buckets: PosInt | None = None
    """How many buckets T_a is summed in (what `allreduce_exposed_s` assumed; `hppctl simulate --plan`
    replays it). None: as for `allreduce_exposed_s`."""
    memory_bytes: list[NonNegInt]
    """Predicted peak memory per device (Eq. 3), aligned with `devices`."""
    memory_budget_bytes: list[NonNegInt]
    backward_layers: Annotated[list[LayerIndex], Field(min_length=2, max_length=2)] | None = None
    """Bi-Partition: half-open range of the layers whose backward this stage runs, when it differs
    from `layers` (docs/bipartition.md); either range may then be empty, not both."""

    @model_validator(mode="after")
    def _aligned(self) -> "StagePlan":
        start, end = self.layers
        back_start, back_end = self.backward_layers or self.layers
        if end < start or back_end < back_start:
            raise ValueError(f"layer range [{start}, {end}) / backward [{back_start}, {back_end}) runs backwards")
        if end == start and back_end == back_start:
            raise ValueError(f"layer range [{start}, {end}) is empty")
        dupes = duplicates(self.devices)
        if dupes:
            raise ValueError(f"device(s) {listed(dupes)} listed twice in one stage")
        n = len(self.devices)
        for field in ("samples", "memory_bytes", "memory_budget_bytes"):
            if len(getattr(self, field)) != n:
                raise ValueError(f"{field} has {len(getattr(self, field))} entries for {n} devices")
        return self

    @property
    def start(self) -> int:
        return self.layers[0]

    @property
    def end(self) -> int:
        return self.layers[1]

    @property
    def backward(self) -> tuple[int, int]:
        """Half-open range of the layers this stage backwards (its `layers` unless Bi-Partition)."""
        start, end = self.backward_layers or self.layers
        return start, end


class TransferPlan(FrozenModel):
    """The communication step between stage `after_stage` and the next one."""

    after_stage: NonNegInt
    bytes_per_micro_batch: NonNegInt
    forward_s: TimeS
    backward_s: TimeS


class Prediction(FrozenModel):
    round_latency_s: NonNegFloat
    throughput_samples_per_s: NonNegFloat
    dominant_step: NonNegInt
    """Index into the step sequence (even: stage s/2, odd: transfer after stage (s-1)/2)."""
    peak_memory_ratio: NonNegFloat
    """max over devices of predicted memory / budget (> 1 means it does not fit)."""


class MemoryViolation(FrozenModel):
    device: DeviceName
    stage: NonNegInt
    needed_bytes: NonNegInt
    budget_bytes: NonNegInt


MicroBatchNote = Annotated[str, Field(min_length=1, max_length=1_000)]


class MicroBatchCandidate(_OmitsUnset):
    """One micro-batch `--micro-batch auto` tried: its plan's predicted throughput, or why it was skipped."""

    _omit_when_default = ("throughput_samples_per_s", "simulated_samples_per_s", "measured_samples_per_s", "skipped")

    micro_batch: PosInt
    throughput_samples_per_s: NonNegFloat | None = None
    """The predicted throughput (the planner's estimate) of the strategy's plan at this micro-batch."""
    simulated_samples_per_s: NonNegFloat | None = None
    """The same plan replayed by the simulator, when the choice ranked by it (`ranked_by: simulated`)."""
    measured_samples_per_s: NonNegFloat | None = None
    """The same plan trained for a few rounds on the cluster (`hppctl plan --trial`, `ranked_by: measured`):
    the median samples/s of its rounds after the warm-up. Only the candidates the trial ran have one."""
    skipped: MicroBatchNote | None = None
    """Why this micro-batch could not be chosen: no plan fits memory, or a device would run more samples
    per micro-batch than the profile measured it at (docs/planner.md, "Choosing the micro-batch")."""

    @model_validator(mode="after")
    def _one_outcome(self) -> "MicroBatchCandidate":
        if (self.throughput_samples_per_s is None) == (self.skipped is None):
            raise ValueError("a candidate has either throughput_samples_per_s or skipped, not both or neither")
        if self.skipped is not None and (self.simulated_samples_per_s, self.measured_samples_per_s) != (None, None):
            raise ValueError("a skipped candidate has no simulated_samples_per_s or measured_samples_per_s")
        return self

    def score(self, ranked_by: str) -> float | None:
        """The figure the choice ranked this candidate by (None: skipped, or not among those measured)."""
        return {"simulated": self.simulated_samples_per_s, "measured": self.measured_samples_per_s}.get(
            ranked_by, self.throughput_samples_per_s)


class MicroBatchChoice(FrozenModel):
    """How `--micro-batch auto` chose the plan's micro-batch: the rule, the winner, every candidate."""

    rule: MicroBatchNote
    ranked_by: Literal["estimate", "simulated", "measured"] = "estimate"
    """Which figure ranked the candidates: the planner's estimate, the simulator's replay of each plan
    (what `hppctl plan` uses; plans written before this field ranked by the estimate), or the throughput
    of the best simulated ones trained for a few rounds on the cluster (`hppctl plan --trial`)."""
    chosen: PosInt
    candidates: Annotated[list[MicroBatchCandidate], Field(min_length=1, max_length=MAX_MICRO_BATCHES)]
    """Ascending micro-batch; the chosen one has the highest `ranked_by` throughput (ties: the smaller)."""

    @model_validator(mode="after")
    def _chosen_is_the_best(self) -> "MicroBatchChoice":
        sizes = [c.micro_batch for c in self.candidates]
        if sizes != sorted(set(sizes)):
            raise ValueError("candidates must list distinct micro-batches in ascending order")
        scored = [c for c in self.candidates if c.score(self.ranked_by) is not None]
        if self.ranked_by in ("simulated", "measured") and any(c.skipped is None and c.simulated_samples_per_s is None
                                                               for c in self.candidates):
            raise ValueError(f"ranked_by {self.ranked_by}: every candidate not skipped needs simulated_samples_per_s")
        best = max(scored, key=lambda c: (c.score(self.ranked_by), -c.micro_batch), default=None)
        if best is None or best.micro_batch != self.chosen:
            raise ValueError(f"chosen {self.chosen} is not the candidate with the highest throughput"
                             f" ({best.micro_batch if best else 'none has one'})")
        return self


class HppPlan(_OmitsUnset):
    """A training plan (hybrid pipeline parallelism). See docs/formats.md."""

    _omit_when_default = ("model_input", "micro_batch_choice", "split_backward")

    format_version: Literal[1] = 1
    kind: Literal["hpp"] = "hpp"
    strategy: Strategy
    model: str
    model_input: ModelInput | None = None
    """A user model's input spec, copied from the profile (models/profile.py ModelInput)."""
    granularity: Granularity
    profile_digest: str
    global_batch: PosInt
    micro_batch: PosInt
    num_micro_batches: MicroBatches
    schedule: Literal["1f1b-asteroid", "1f1b", "gpipe"] = "1f1b-asteroid"
    split_backward: bool = False
    """Run every backward as an input half (`I`) and a deferred weight half (`W`) that fills time the
    device would wait (zero-bubble, ZB-H1's idea; models/schedule.py). Omitted when false."""
    stages: Annotated[list[StagePlan], Field(min_length=1, max_length=MAX_DEVICES)]
    transfers: list[TransferPlan]
    prediction: Prediction
    memory_violations: list[MemoryViolation] = []
    """Filled only by strategies that ignore memory budgets (pipedream, dapple); never by asteroid."""
    planning_time_s: NonNegFloat = 0.0
    micro_batch_choice: MicroBatchChoice | None = None
    """Set when `--micro-batch auto` chose `micro_batch` (omitted otherwise, so older files load as before)."""

    @model_validator(mode="after")
    def _consistent(self) -> "HppPlan":
        if self.micro_batch * self.num_micro_batches != self.global_batch:
            raise ValueError(f"micro_batch {self.micro_batch} x num_micro_batches {self.num_micro_batches} "
                             f"!= global_batch {self.global_batch}")
        if self.micro_batch_choice is not None and self.micro_batch_choice.chosen != self.micro_batch:
            raise ValueError(f"micro_batch_choice.chosen {self.micro_batch_choice.chosen} is not micro_batch "
                             f"{self.micro_batch}")
        expected, expected_back = 0, 0
        seen: set[str] = set()
        for i, stage in enumerate(self.stages):
            if stage.start != expected:
                raise ValueError(f"stage {i} starts at layer {stage.start}, expected {expected}")
            if stage.backward[0] != expected_back:
                raise ValueError(f"stage {i} backwards from layer {stage.backward[0]}, expected {expected_back}")
            expected, expected_back = stage.end, stage.backward[1]
            if sum(stage.samples) != self.micro_batch:
                raise ValueError(f"stage {i} assigns {sum(stage.samples)} samples per micro-batch, "
                                 f"micro_batch is {self.micro_batch}")
            reused = seen.intersection(stage.devices)
            if reused:
                raise ValueError(f"stage {i} reuses device(s) {listed(sorted(reused))}")
            seen.update(stage.devices)
        if expected_back != expected:
            raise ValueError(f"the backward ranges end at layer {expected_back}, the forward ranges at {expected}")
        for i, stage in enumerate(self.stages):
            if self.split_backward and stage.weight_grad_s is None:
                raise ValueError(f"split_backward plans need weight_grad_s on every stage (stage {i} has none)")
            if stage.in_flight_cap is not None and stage.in_flight_cap < min(stage.warmup, self.num_micro_batches):
                raise ValueError(f"stage {i}: in_flight_cap {stage.in_flight_cap} is below its warmup {stage.warmup}")
            if stage.weight_grad_s is not None and stage.weight_grad_s > stage.backward_s:
                raise ValueError(f"stage {i}: weight_grad_s {stage.weight_grad_s} is more than backward_s {stage.backward_s}")
        if len(self.transfers) != len(self.stages) - 1:
            raise ValueError(f"{len(self.stages)} stages need {len(self.stages) - 1} transfers, got {len(self.transfers)}")
        return self

    @property
    def num_layers(self) -> int:
        return self.stages[-1].end

    def devices(self) -> list[str]:
        return [d for s in self.stages for d in s.devices]


class PlanRequest(FrozenModel):
    """What the user asks `hppctl plan` for."""

    global_batch: PosInt
    micro_batch: PosInt
    schedule: Literal["1f1b-asteroid", "1f1b", "gpipe"] = "1f1b-asteroid"

    @model_validator(mode="after")
    def _divides(self) -> "PlanRequest":
        if self.global_batch % self.micro_batch:
            raise ValueError(f"micro_batch {self.micro_batch} does not divide global_batch {self.global_batch}")
        if self.num_micro_batches > MAX_MICRO_BATCHES:
            raise ValueError(f"global_batch {self.global_batch} / micro_batch {self.micro_batch} is "
                             f"{self.num_micro_batches} micro-batches per round, more than the limit of "
                             f"{MAX_MICRO_BATCHES} (docs/formats.md, Limits)")
        return self

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // self.micro_batch
