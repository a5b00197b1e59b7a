"""Where a worker computes, in what precision, and how its tensors reach gloo.

A device of the cluster file says `accelerator: cpu | cuda | auto` (models/cluster.py; default
cpu). The worker resolves it on the device itself (`resolve`): the launcher's machine may have no
GPU while the device has one. The profiling probe resolves it with the same function and reads the
accelerator's name, memory and peak allocation through the functions at the end of this module
(`describe`, `synchronize`, `peak_memory_bytes`), so a profile measures what a run computes on.
Everything downstream takes the resulting `torch.device` as a parameter (the training-state
factory, the stages, the executors, Galaxy's forward); nothing else asks which accelerator it is on.

Communication stays on gloo, which moves CPU tensors only (NCCL is not available on Jetsons and
cannot join heterogeneous groups): `to_wire` stages a tensor in host memory before a send or an
AllReduce, `from_wire` puts a received one on the compute device. On a CPU device both return the
tensor they were given, so a CPU run does exactly what it did before accelerators existed.

Precision (`--precision fp32 | fp16 | bf16`): `Precision.autocast()` around the forward (and the
loss), on the stage's device type. fp16 multiplies the loss by one static scale shared by every
stage of the pipeline (`FP16_LOSS_SCALE`), and each stage unscales its own gradients before its
step (`Precision.unscale`). torch's GradScaler is not used: its scale is dynamic and per process,
so after an overflow the tail would back off while the stages before it still unscale the
gradients they receive (which carry the tail's scale) by their own; keeping one scale for the run
keeps every stage's unscale exact. A stage whose unscaled gradients hold an inf or NaN skips that
step (its optimizer state untouched); the others may still step. bf16 has fp32's range, so it
runs without a scale.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from hppctl.errors import BadInput

ACCELERATORS = ("cpu", "cuda", "auto")
PRECISIONS = ("fp32", "fp16", "bf16")
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
FP16_LOSS_SCALE = 1024.0
"""The loss scale of an fp16 run, one for all stages (see the module docstring): 2**10 lifts
gradients below fp16's smallest normal (6e-5) by three decades while a loss of the order of 10
stays far from fp16's maximum (65504)."""


class AcceleratorUnavailable(BadInput):
    """The cluster file asks for an accelerator this device does not have."""


def resolve(accelerator: str, *, device_name: str = "this device",
            cuda_available: Callable[[], bool] | None = None) -> torch.device:
    """The `torch.device` a worker computes on for the cluster file's `accelerator:` value.

    `cuda_available` defaults to `torch.cuda.is_available` (a parameter so that `auto` can be
    exercised on a machine without CUDA)."""
    available = (cuda_available or torch.cuda.is_available)
    if accelerator == "cpu":
        return torch.device("cpu")
    if accelerator == "auto":
        return torch.device("cuda", 0) if available() else torch.device("cpu")
    if accelerator == "cuda":
        if not available():
            raise AcceleratorUnavailable(
                f"device {device_name}: accelerator: cuda, but torch {torch.__version__} sees no CUDA device there "
                f"(torch.cuda.is_available() is False); use accelerator: auto or cpu")
        return torch.device("cuda", 0)
    raise BadInput(f"device {device_name}: accelerator: {accelerator!r} is not one of {', '.join(ACCELERATORS)}")


# --- gloo staging -------------------------------------------------------------------------------

def to_wire(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`tensor` in host memory (and in `dtype`, the receiver's buffer type, if given), ready for gloo.

    A CPU tensor of the right type is returned as it is. The device-to-host copy is blocking: a
    non-blocking one into pageable memory is synchronous anyway, and into pinned memory gloo could
    read it before the copy lands."""
    if tensor.device.type == "cpu" and (dtype is None or tensor.dtype == dtype):
        return tensor
    return tensor.detach().to(device="cpu", dtype=dtype or tensor.dtype)


def seed_generators(seed: int, device: torch.device) -> None:
    """Seed what a step draws from (dropout): the CPU generator, and the accelerator's when the stage
    computes on one. `torch.manual_seed` also queues a seeding of every CUDA, XPU and MTIA device,
    formatting a stack trace for each when none is initialised (137 µs a call against 1.6 µs here,
    on a quiet core; 6 % of a tiny-cnn worker's samples on a loaded one), once per round."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":  # initialised by the stage's tensors: seeded at once, as torch.manual_seed did
        torch.cuda.manual_seed_all(seed)


def pinned_for(device: torch.device) -> bool:
    """Whether host buffers that receive for `device` should be page-locked: on CUDA, so that the
    copy `from_wire` starts is asynchronous (from pageable memory it blocks the host); never on the CPU."""
    return device.type == "cuda"


def from_wire(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor gloo filled in host memory, on `device`. The host-to-device copy is non-blocking:
    the stream orders it before any kernel that reads it, and the host buffer is not reused."""
    if tensor.device == device:
        return tensor
    return tensor.to(device, non_blocking=True)


# --- precision ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Precision:
    """What `--precision` means on one device: its autocast, its loss scale, its unscale."""

    mode: str = "fp32"
    device_type: str = "cpu"

    @property
    def loss_scale(self) -> float:
        return FP16_LOSS_SCALE if self.mode == "fp16" else 1.0

    def autocast(self):
        """The context of a forward pass: nothing in fp32 (so fp32 runs are bit-identical to runs
        before `--precision`), torch.autocast on the device's type otherwise."""
        if self.mode == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=AUTOCAST_DTYPES[self.mode])

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to back-propagate (the tail's, or a Bi-Partition worker's at the last layer)."""
        return loss if self.loss_scale == 1.0 else loss * self.loss_scale

    def unscale(self, params: Iterable[torch.Tensor]) -> bool:
        """Divide the accumulated gradients by the run's loss scale; False when one is not finite
        (the step must be skipped). In fp32 and bf16: nothing to do, True."""
        if self.loss_scale == 1.0:
            return True
        grads = [p.grad for p in params if p.grad is not None]
        finite = True
        with torch.no_grad():
            for g in grads:
                g.mul_(1.0 / self.loss_scale)
                finite = finite and bool(torch.isfinite(g).all())
        return finite


def precision_for(mode: str, device: torch.device) -> Precision:
    """`mode` on `device`, refused (BadInput, one line) when torch cannot autocast there."""
    check_precision(mode, device)
    return Precision(mode, device.type)


def check_precision(mode: str, device: torch.device) -> None:
    if mode not in PRECISIONS:
        raise BadInput(f"--precision: {mode!r} is not one of {', '.join(PRECISIONS)}")
    if mode == "fp32" or device.type == "meta":
        return
    dtype = AUTOCAST_DTYPES[mode]
    try:
        with torch.autocast(device.type, dtype=dtype):
            probe = torch.nn.functional.linear(torch.ones(1, 2, device=device), torch.ones(2, 2, device=device))
    except (RuntimeError, ValueError, AssertionError) as e:
        raise BadInput(f"--precision {mode}: torch {torch.__version__} cannot autocast to {dtype} on "
                       f"{device.type} ({str(e).splitlines()[0] if str(e) else e.__class__.__name__})") from None
    if probe.dtype != dtype:
        raise BadInput(f"--precision {mode}: torch {torch.__version__} does not run a linear layer in {dtype} "
                       f"under autocast on {device.type} (got {probe.dtype})")


# --- what a device has ----------------------------------------------------------------------------

def describe(device: torch.device) -> dict:
    """The accelerator of a resolved device: `{"type", "name", "memory_bytes", "integrated"}`
    (memory: the GPU's total as CUDA reports it; integrated: the GPU shares the host's memory, as a
    Jetson's does; None on the CPU, whose memory the profile's host figures give)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "memory_bytes": int(props.total_memory),
                "integrated": bool(getattr(props, "is_integrated", False))}
    return {"type": device.type, "name": None, "memory_bytes": None, "integrated": None}


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (before reading a host clock around it); nothing on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated_bytes(device: torch.device) -> int | None:
    """What the CUDA allocator holds in tensors now; None on the CPU (the process's RSS is the measure)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return None


def synchronized_clock(device: torch.device, clock: Callable[[], float]) -> Callable[[], float]:
    """`clock`, read after the device's queued work is done (CUDA kernels run asynchronously: a
    host clock read right after a launch would time the launch); `clock` itself on the CPU."""
    if device.type != "cuda":
        return clock

    def read() -> float:
        torch.cuda.synchronize(device)
        return clock()
    return read


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """The allocator's peak since the last reset (CUDA); None where the process's RSS is the measure."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


def check_local_devices(cluster, devices, precision: str, *, cluster_source: str = "--cluster") -> None:
    """Before any worker starts: every `local: true` device of the run is this machine, so its
    accelerator resolves here, and `precision` must autocast on it (BadInput, one line naming the
    file, the device's field and its value). A `host:` device resolves on itself, when its worker
    starts (a missing GPU there fails the run naming the device)."""
    names = [d.name for d in cluster.devices]
    for name in devices:
        spec = cluster.device(name)
        if not spec.local:
            continue
        try:
            device = resolve(spec.accelerator, device_name=name)
        except AcceleratorUnavailable:
            raise BadInput(f"{cluster_source}: devices.{names.index(name)}.accelerator: {spec.accelerator!r} for local "
                           f"device {name}, but torch {torch.__version__} sees no CUDA device on this machine "
                           f"(torch.cuda.is_available() is False); use auto or cpu") from None
        check_precision(precision, device)


def refuse_cuda(cluster, what: str, *, cluster_source: str = "--cluster") -> None:
    """Runs that compute on the CPU only (`what`: "psl plans") refuse a device that asks for CUDA
    (BadInput, one line) rather than ignore it; `auto` means "CUDA if there is one", so it runs on
    the CPU there."""
    for i, spec in enumerate(cluster.devices):
        if spec.accelerator == "cuda":
            raise BadInput(f"{cluster_source}: devices.{i}.accelerator: 'cuda' for device {spec.name}: {what} compute "
                           f"on the CPU only (use cpu or auto)")
