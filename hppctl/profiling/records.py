"""The records a probe prints (one JSON object per line), as typed data. Pure: no torch, no I/O.

They cross a process (and usually a network) boundary, so they are strict frozen models like
every other file format; a probe of another version is refused before it runs (remote.py checks
`hppctl --version`), and PROBE_VERSION is part of every cache key.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hppctl.models.base import FrozenModel

NonNegFloat = Annotated[float, Field(ge=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(gt=0)]


class AcceleratorRecord(FrozenModel):
    """`identify`: the cluster file's `accelerator:` as the device resolved it (runtime/accelerator.py)."""

    requested: Literal["cpu", "cuda", "auto"]
    type: str
    """`cpu` or `cuda`: what `requested` resolved to on the device."""
    name: str | None = None
    """The GPU's name (CUDA)."""
    memory_bytes: NonNegInt | None = None
    """The GPU's memory as CUDA reports it (on a Jetson: the unified memory it can address)."""
    integrated: bool | None = None
    """The GPU shares the host's memory (Jetson)."""


class Identity(FrozenModel):
    """`identify`: what the device is and offers (device.identify)."""

    type: Literal["identity"] = "identity"
    hostname: str
    machine: str
    cpu_model: str
    cpus: PosInt
    cpu_quota_cores: NonNegFloat | None
    cpu_quota_source: str
    threads: PosInt
    threads_source: str
    memory_total_bytes: NonNegInt | None
    memory_available_bytes: NonNegInt | None
    memory_limit_bytes: NonNegInt | None
    memory_limit_source: str
    omp_num_threads: str | None
    python: str
    torch: str | None
    transformers: str | None
    hppctl: str
    kernel: str
    accelerator: AcceleratorRecord | None = None
    """None in records of probes older than accelerators (a CPU)."""
    probe_version: PosInt | None = None
    """The device's PROBE_VERSION (probe.py); None from probes older than 5. The hppctl version alone
    does not tell the code: a device may run other hppctl code under the same version string."""


class Setup(FrozenModel):
    """`train`: the model is built and cut into one stage per layer."""

    type: Literal["setup"] = "setup"
    layers: PosInt
    threads: PosInt
    clock: Literal["cpu", "wall"]
    runtime_bytes: NonNegInt
    model_bytes: NonNegInt
    param_bytes: NonNegInt
    setup_s: NonNegFloat
    model_fingerprint: str | None = None
    stage_call_s: NonNegFloat = 0.0
    """What timing a layer through its own one-layer stage adds to its forward (train_probe.py)."""


class Step(FrozenModel):
    """Whole training steps run back to back at one batch size."""

    count: PosInt
    wall_s: NonNegFloat
    cpu_s: NonNegFloat
    clock_s: Annotated[list[NonNegFloat], Field(min_length=1)]
    """Each step's time on the probe's clock."""


class Memory(FrozenModel):
    """`train`: the peak memory of one training step at a batch size (and what else the first steps showed)."""

    type: Literal["memory"] = "memory"
    batch_size: PosInt
    peak_bytes: NonNegInt
    peak_method: str
    notes: list[str] = []
    optimizer_step_s: list[NonNegFloat] = []


class Pass(FrozenModel):
    """`train`: one timed round at a batch size: every layer's forward and backward, then whole steps."""

    type: Literal["pass"] = "pass"
    batch_size: PosInt
    forward: list[NonNegFloat]
    backward: list[NonNegFloat]
    weight_grad: list[NonNegFloat] | None = None
    """Each layer's weight-gradient part of `backward` (its backward minus an input-gradient-only
    backward, train_probe.py). None in the records of probes older than PROBE_VERSION 5."""
    step: Step


class Batch(FrozenModel):
    """Everything measured at one batch size, assembled from its `Memory` and `Pass` records (parse.py)."""

    batch_size: PosInt
    clock: Literal["cpu", "wall"]
    forward: list[list[NonNegFloat]]
    """forward[layer] = one value per pass."""
    backward: list[list[NonNegFloat]]
    weight_grad: list[list[NonNegFloat]] | None = None
    """weight_grad[layer] = one value per pass; None unless every pass measured it."""
    step: Step
    """The passes' step windows together."""
    optimizer_step_s: list[NonNegFloat] = []
    peak_bytes: NonNegInt
    peak_method: str
    notes: list[str] = []


class Skip(FrozenModel):
    """`train`: a batch size left out (it would not fit the memory budget)."""

    type: Literal["skip"] = "skip"
    batch_size: PosInt
    reason: str


class Progress(FrozenModel):
    type: Literal["progress"] = "progress"
    phase: str
    done: NonNegInt
    total: NonNegInt
    batch_size: PosInt | None = None


class Received(FrozenModel):
    """`recv`: one TCP transfer, seen by the receiver."""

    type: Literal["recv"] = "recv"
    bound: str
    bytes: NonNegInt
    seconds: NonNegFloat
    bytes_per_s: NonNegFloat
    refused: NonNegInt = 0
    """Connections the server turned away before this step (netprobe.py); the client's record has none."""


class Ping(FrozenModel):
    type: Literal["ping"] = "ping"
    rtt_s: Annotated[list[NonNegFloat], Field(min_length=1)]
