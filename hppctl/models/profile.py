"""A profile: per-layer costs of one model on every device of a cluster, and the links between them.

Produced by `hppctl profile` (from presets or by measurement); consumed by the planner.
Layer indices are positions in the model's layer sequence; stages take half-open ranges
`[start, end)` of it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import Field, model_validator

from hppctl.models.base import FrozenModel
from hppctl.models.cluster import DeviceName

Granularity = Literal["fine", "block"]
NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


class LayerCost(FrozenModel):
    """One layer of the sequence, per sample unless the name says otherwise."""

    name: str
    kind: str
    """Module type, e.g. `Conv2d`, `BertLayer`."""
    boundary_bytes_per_sample: NonNegInt
    """Bytes that cross a cut placed right AFTER this layer: the layer's output plus every
    earlier tensor still needed later (residual branches, attention masks). This is what a
    pipeline sends forward, and the gradient it sends back has the same size."""
    activation_bytes_per_sample: NonNegInt
    """Bytes this layer keeps for backward (its intermediate tensors)."""
    param_bytes: NonNegInt
    forward_flops_per_sample: NonNegInt


class DeviceProfile(FrozenModel):
    """Timings of every layer on one device, on a grid of batch sizes."""

    name: DeviceName
    kind: str
    """Preset name, or `measured:<hostname>`."""
    memory_bytes: PosInt
    """Memory budget the planner may use on this device."""
    batch_sizes: Annotated[list[PosInt], Field(min_length=1)]
    """Increasing batch sizes at which the layers were timed."""
    forward_s: list[list[NonNegFloat]]
    """forward_s[layer][i] = seconds for one forward of the layer at batch_sizes[i]."""
    backward_s: list[list[NonNegFloat]]
    peak_flops: NonNegFloat | None = None
    """Peak FLOP/s if known (presets); used only for reporting."""

    @model_validator(mode="after")
    def _grid_shapes(self) -> "DeviceProfile":
        if sorted(set(self.batch_sizes)) != self.batch_sizes:
            raise ValueError(f"device {self.name}: batch_sizes must be strictly increasing, got {self.batch_sizes}")
        width = len(self.batch_sizes)
        for field in ("forward_s", "backward_s"):
            for i, row in enumerate(getattr(self, field)):
                if len(row) != width:
                    raise ValueError(f"device {self.name}: {field}[{i}] has {len(row)} values, batch_sizes has {width}")
        if len(self.forward_s) != len(self.backward_s):
            raise ValueError(f"device {self.name}: forward_s and backward_s list different layer counts")
        return self


class LinkProfile(FrozenModel):
    """Measured or configured bandwidth between two devices (symmetric)."""

    between: Annotated[list[DeviceName], Field(min_length=2, max_length=2)]
    bytes_per_s: Annotated[float, Field(gt=0)]


class Profile(FrozenModel):
    """Everything the planner needs; see docs/formats.md."""

    format_version: Literal[1] = 1
    source: Literal["preset", "measured", "synthetic"]
    cluster: str
    model: str
    granularity: Granularity
    dtype_bytes: PosInt = 4
    optimizer_state_factor: NonNegFloat = 1.0
    """Optimizer state in units of the parameter bytes (0 SGD, 1 SGD+momentum, 2 Adam)."""
    layers: Annotated[list[LayerCost], Field(min_length=1)]
    devices: Annotated[list[DeviceProfile], Field(min_length=1)]
    default_bytes_per_s: Annotated[float, Field(gt=0)]
    links: list[LinkProfile] = []

    @model_validator(mode="after")
    def _consistent(self) -> "Profile":
        names = [d.name for d in self.devices]
        if len(set(names)) != len(names):
            raise ValueError("duplicate device names in profile")
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
