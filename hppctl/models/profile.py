"""A profile: per-layer costs of one model on every device of a cluster, and the links between them.

Produced by `hppctl profile` (from presets or by measurement); consumed by the planner.
Layer indices are positions in the model's layer sequence; stages take half-open ranges
`[start, end)` of it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_serializer, model_validator

from hppctl.limits import MAX_DEVICES, MAX_LAYERS
from hppctl.models.base import FrozenModel, duplicates, listed
from hppctl.models.cluster import DeviceName
from hppctl.models.units import MAX_BYTES, MAX_DURATION

Granularity = Literal["fine", "block"]
NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""Times, rates and factors: finite, so `forward_s: .inf` is refused naming the field (it reached the
schedule generator as NaN, blamed on `--policy`)."""
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
TimeS = Annotated[float, Field(ge=0, le=MAX_DURATION, allow_inf_nan=False)]
"""A measured or predicted duration: at most a day (1e308 s summed to inf: a ZeroDivisionError in the planner)."""
ByteCount = Annotated[int, Field(ge=0, le=MAX_BYTES)]
"""Bytes of a layer or a device: at most 1 PiB, like sizes in cluster files (models/units.py)."""
Source = Literal["preset", "measured", "synthetic"]
MAX_INPUT_DIMS = 8


class ModelInput(FrozenModel):
    """One sample of a user model's input (`--model package.module:factory`, hppctl/zoo/user.py):
    recorded in the profile, the plan and every worker's config beside `model`, so that later
    commands and the workers rebuild the same model without the flags again."""

    shape: Annotated[list[PosInt], Field(min_length=1, max_length=MAX_INPUT_DIMS)]
    """Per sample, without the batch dimension: [3, 224, 224] for an image."""
    dtype: Literal["float32", "int64"] = "float32"


class _OmitsUnset(FrozenModel):
    """Optional fields added after format 1 was published are left out of files (and so of the
    digest) while they hold their default, so older files and digests stay byte-identical."""

    _omit_when_default: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler) -> dict[str, Any]:
        data = handler(self)
        for key in self._omit_when_default:
            if key in data and (data[key] is None or data[key] is False or data[key] == []):
                del data[key]
        return data


class LayerCost(FrozenModel):
    """One layer of the sequence, per sample unless the name says otherwise."""

    name: str
    kind: str
    """Module type, e.g. `Conv2d`, `BertLayer`."""
    boundary_bytes_per_sample: ByteCount
    """Bytes that cross a cut placed right AFTER this layer: the layer's output plus every
    earlier tensor still needed later (residual branches, attention masks). This is what a
    pipeline sends forward, and the gradient it sends back has the same size."""
    activation_bytes_per_sample: ByteCount
    """Bytes this layer keeps for backward (its intermediate tensors)."""
    param_bytes: ByteCount
    forward_flops_per_sample: NonNegInt


class MeasurementInfo(FrozenModel):
    """How a measured device was measured (docs/profiling.md); for people and for cache checks."""

    hostname: str
    cpu_model: str
    cpus: PosInt
    """CPUs in the probe's affinity mask."""
    cpu_quota_cores: NonNegFloat | None
    """CPU quota (cores) or None when unlimited."""
    cpu_quota_source: str
    threads: PosInt
    """torch intra-op threads the layers were timed with (ceil of the quota)."""
    clock: Literal["cpu", "wall"]
    """What each repeat was timed with: process CPU time (one thread) or wall time."""
    repeats: PosInt
    warmup: NonNegInt
    sustained_factor: list[NonNegFloat]
    """Per batch size: sustained wall time of a whole step / its time on `clock` (>= 1 on a throttled device)."""
    step_clock_s: list[TimeS]
    """Per batch size: median time of a whole training step on `clock` (to check the layer sum)."""
    optimizer_step_s: TimeS | None = None
    """One SGD-with-momentum update of every parameter."""
    stage_call_s: TimeS | None = None
    """Per layer, the cost of calling its one-layer stage on its own, taken off its forward times."""
    memory_budget_source: str
    memory_measured_bytes: NonNegInt | None = None
    """The cgroup limit, or MemAvailable when there is none."""
    fingerprint: str
    python: str
    torch: str | None = None
    hppctl: str
    notes: list[str] = []


class AcceleratorProfile(FrozenModel):
    """The GPU a measured device computes on (its cluster file said `accelerator: cuda` or `auto`)."""

    type: str
    """`cuda`."""
    name: str | None = None
    memory_bytes: NonNegInt | None = None
    """The GPU's memory as CUDA reports it; the budget (`memory_bytes` of the device) derives from it
    (profiling/parse.py memory_budget)."""
    integrated: bool | None = None
    """Unified memory shared with the host (a Jetson)."""


class DeviceProfile(_OmitsUnset):
    """Timings of every layer on one device, on a grid of batch sizes."""

    _omit_when_default = ("source", "forward_spread", "backward_spread", "weight_grad_s", "train_step_s",
                          "train_peak_bytes", "runtime_bytes", "measurement", "accelerator")

    name: DeviceName
    kind: str
    """Preset name, or `measured:<hostname>`."""
    memory_bytes: Annotated[int, Field(gt=0, le=MAX_BYTES)]
    """Memory budget the planner may use on this device."""
    batch_sizes: Annotated[list[PosInt], Field(min_length=1)]
    """Increasing batch sizes at which the layers were timed."""
    forward_s: list[list[TimeS]]
    """forward_s[layer][i] = seconds for one forward of the layer at batch_sizes[i]."""
    backward_s: list[list[TimeS]]
    weight_grad_s: list[list[TimeS]] | None = None
    """weight_grad_s[layer][i] = the part of backward_s[layer][i] that computes the layer's weight
    gradients (its backward minus an input-gradient-only backward): what a split backward defers to
    its `W` action. None (left out of the file) when not measured or predicted; split-backward
    schedules then cannot be simulated or planned from the profile."""
    peak_flops: NonNegFloat | None = None
    """Peak FLOP/s if known (presets); used only for reporting."""
    source: Source | None = None
    """`measured` or `preset` (a cluster may mix them); absent in files written before measurement."""
    forward_spread: list[list[NonNegFloat]] | None = None
    """Measured only: (q3 - q1) / median of the repeated forward times, per layer and batch size."""
    backward_spread: list[list[NonNegFloat]] | None = None
    train_step_s: list[TimeS] | None = None
    """Measured only: wall seconds of one whole training step (forward, loss, backward), sustained."""
    train_peak_bytes: list[NonNegInt] | None = None
    """Measured only: peak memory of one training step above the process holding the model."""
    runtime_bytes: NonNegInt | None = None
    """Measured only: memory of a worker process before any tensor (interpreter, torch, libraries)."""
    measurement: MeasurementInfo | None = None
    accelerator: AcceleratorProfile | None = None
    """Measured on a GPU; None (left out of the file) for a CPU."""

    @model_validator(mode="after")
    def _grid_shapes(self) -> "DeviceProfile":
        if sorted(set(self.batch_sizes)) != self.batch_sizes:
            raise ValueError(f"device {self.name}: batch_sizes must be strictly increasing, got {self.batch_sizes}")
        width = len(self.batch_sizes)
        for field in ("forward_s", "backward_s", "weight_grad_s", "forward_spread", "backward_spread"):
            for i, row in enumerate(getattr(self, field) or []):
                if len(row) != width:
                    raise ValueError(f"device {self.name}: {field}[{i}] has {len(row)} values, batch_sizes has {width}")
        if len(self.forward_s) != len(self.backward_s):
            raise ValueError(f"device {self.name}: forward_s and backward_s list different layer counts")
        for field in ("weight_grad_s", "forward_spread", "backward_spread"):
            rows = getattr(self, field)
            if rows is not None and len(rows) != len(self.forward_s):
                raise ValueError(f"device {self.name}: {field} has {len(rows)} layers, forward_s has {len(self.forward_s)}")
        for layer, (w_row, b_row) in enumerate(zip(self.weight_grad_s or [], self.backward_s)):
            for w, b, batch in zip(w_row, b_row, self.batch_sizes):
                if w > b:
                    raise ValueError(f"device {self.name}: weight_grad_s[{layer}] at batch {batch} is {w}, more than "
                                     f"the layer's whole backward_s {b}")
        for field in ("train_step_s", "train_peak_bytes"):
            row = getattr(self, field)
            if row is not None and len(row) != width:
                raise ValueError(f"device {self.name}: {field} has {len(row)} values, batch_sizes has {width}")
        return self


class LinkProfile(_OmitsUnset):
    """Measured or configured bandwidth between two devices (symmetric)."""

    _omit_when_default = ("directed_bytes_per_s", "rtt_s", "source")

    between: Annotated[list[DeviceName], Field(min_length=2, max_length=2)]
    bytes_per_s: PosFloat
    """What the planner uses: for a measured link, the slower of the two directions."""
    directed_bytes_per_s: Annotated[list[NonNegFloat], Field(min_length=2, max_length=2)] | None = None
    """Measured: goodput from between[0] to between[1], and back."""
    rtt_s: TimeS | None = None
    """Measured: median round trip of one byte over TCP."""
    source: Literal["measured", "inventory"] | None = None


class MissingDevice(FrozenModel):
    """A device of the cluster that could not be profiled, and why."""

    name: DeviceName
    reason: str


class Profile(_OmitsUnset):
    """Everything the planner needs; see docs/formats.md."""

    _omit_when_default = ("missing_devices", "model_input")

    format_version: Literal[1] = 1
    source: Source
    cluster: str
    model: str
    model_input: ModelInput | None = None
    """A user model's input spec (None: a zoo model, whose name says it)."""
    granularity: Granularity
    dtype_bytes: PosInt = 4
    optimizer_state_factor: NonNegFloat = 1.0
    """Optimizer state in units of the parameter bytes (0 SGD, 1 SGD+momentum, 2 Adam)."""
    layers: Annotated[list[LayerCost], Field(min_length=1, max_length=MAX_LAYERS)]
    devices: Annotated[list[DeviceProfile], Field(min_length=1, max_length=MAX_DEVICES)]
    default_bytes_per_s: PosFloat
    links: list[LinkProfile] = []
    missing_devices: list[MissingDevice] = []
    """Devices of the cluster that could not be profiled (`hppctl profile` exits 1); not in `devices`."""

    @model_validator(mode="after")
    def _consistent(self) -> "Profile":
        dupes = duplicates(d.name for d in self.devices)
        if dupes:
            raise ValueError(f"duplicate device names in profile: {listed(dupes)}")
        names = {d.name for d in self.devices}
        for missing in self.missing_devices:
            if missing.name in names:
                raise ValueError(f"device {missing.name!r} is both profiled and missing")
        for d in self.devices:
            if len(d.forward_s) != len(self.layers):
                raise ValueError(f"device {d.name} has timings for {len(d.forward_s)} layers, model has {len(self.layers)}")
        for link in self.links:
            for end in link.between:
                if end not in names:
                    raise ValueError(f"link names unknown device {end!r}")
        return self

    def digest(self) -> str:
        """Content hash a plan records so that it is refused against any other profile."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def bandwidth_between(self, a: str, b: str) -> float:
        for link in self.links:
            if set(link.between) == {a, b}:
                return link.bytes_per_s
        return self.default_bytes_per_s
