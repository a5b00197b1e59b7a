"""What the launcher tells each inference worker (one JSON line on its stdin, with the run's token)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hppctl.models.base import FrozenModel
from hppctl.models.cluster import DeviceName
from hppctl.models.inference import InferenceStrategy
from hppctl.runtime.workdir import UserCode


class InferenceWorkerConfig(FrozenModel):
    device: DeviceName
    rank: Annotated[int, Field(ge=0)]
    """Index of the device in the plan's shares (its place on the ring and in the sequence)."""
    world_size: Annotated[int, Field(gt=0)]
    store_host: str
    store_port: Annotated[int, Field(gt=0, le=65535)]
    strategy: InferenceStrategy
    row_sizes: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    """Sequence rows of every device, in ring order."""
    overlap: bool
    """Tile overlap of every ring collective, unless `block_overlap` says per collective."""
    block_overlap: Annotated[list[bool], Field(min_length=4, max_length=4)] | None = None
    """Galaxy: overlap per ring collective of a layer (the plan's `block_overlap`; all false with --no-overlap)."""
    collective: Literal["ring", "all-reduce"] = "ring"
    """Galaxy: the plan's collective (hmp.forward)."""
    repeats: Annotated[int, Field(gt=0)] = 1
    warmup: Annotated[int, Field(ge=0)] = 0
    threads: Annotated[int, Field(ge=0)] = 0
    """torch intra-op threads; 0 leaves torch's default (OMP_NUM_THREADS on lab hosts)."""
    budget_bytes: Annotated[int, Field(gt=0)] | None = None
    """The device's memory budget: the worker refuses a shard whose layer weights exceed it."""
    wire_dtype: Literal["float32", "float16"] = "float32"
    """What the collectives carry (float16: half the bytes, as the paper's fp16 models send)."""
    timeout_s: Annotated[float, Field(gt=0)] = 300.0
    progress_every_s: Annotated[float, Field(gt=0)] = 0.5
    """How often the worker may report the passes it has run (runtime/progress.py)."""
    accelerator: Literal["cpu", "cuda", "auto"] = "cpu"
    """The device's `accelerator:` from the cluster file, resolved by the worker (runtime/accelerator.py)."""
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"
    """Autocast dtype of the forward (`--precision`); fp32: no autocast."""
    user_code: UserCode | None = None
    """The run's `--workdir` on this device and its user modules (runtime/workdir.py; the launcher
    fills it, runtime/worker_entry.py reads it); None: neither."""
