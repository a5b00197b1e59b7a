"""What a worker is told: the run's options and its own device. Crosses the launcher → worker boundary
as one JSON line on the worker's standard input (with the run's token beside it, never in a file)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field

from hppctl.models.base import FrozenModel
from hppctl.models.profile import ModelInput
from hppctl.models.schedule import Schedule
from hppctl.planner.cost import ALLREDUCE_BUCKET_BYTES
from hppctl.runtime.workdir import UserCode

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]


def dropout_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed a worker sets before round (or PSL step) `step`: its dropout masks then depend on
    the run's seed, the step and its rank only, so a resumed run draws the ones the uninterrupted run
    would have (bench/peers.py reproduces them for its references, bench/peer_worker.py for the peers)."""
    return seed * 1_000_003 + step * 1_009 + rank


class TrainOptions(FrozenModel):
    """Training hyper-parameters and bookkeeping, identical on every worker."""

    dataset: str = "synthetic"
    """`synthetic`, `digits`, `package.module:factory` (runtime/data.py), or a path: a folder of images,
    a .pt, .npz or .csv file, `PATH#label=NAME` for a CSV's label column (runtime/datasets.py)."""
    seed: int = 0
    """Model weights, sample order (with the epoch) and dropout masks (with the round and device)."""
    rounds: PosInt = 1
    """Rounds to run in total, counting those a resumed checkpoint already holds."""
    start_round: NonNegInt = 0
    """First round to run (the checkpoint's round when resuming)."""
    schedule_start: NonNegInt = 0
    """First round of the learning-rate schedule's cycle: 0, or the round a `--more-rounds` run
    resumed from. Each such extension is a cycle of its own (warm restart, as in SGDR): its warm-up,
    then its schedule over the rounds from `schedule_start` to `rounds`."""
    optimizer: Literal["sgd", "adam"] = "sgd"
    """The commands fill optimizer, lr and momentum from the model family's default when no flag names
    them (runtime/optimizer_defaults.py); these field defaults (SGD 0.05, momentum 0.9, the commands'
    default before issue 25) serve library callers and the tests' references, which give them all."""
    lr: PosFloat = 0.05
    """Peak learning rate (the rate throughout with `lr_schedule="constant"`)."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """cosine: after the warm-up, decays from `lr` to 0 along half a cosine over the cycle's remaining rounds."""
    warmup_rounds: NonNegInt = 0
    """Rounds over which the rate rises linearly from lr / warmup_rounds to `lr` (either schedule)."""
    momentum: NonNegFloat = 0.9
    """SGD momentum (0: plain SGD); ignored by Adam."""
    weight_decay: NonNegFloat = 0.0
    checkpoint_every: NonNegInt = 0
    """Send the stage state to the launcher every K rounds (0: never)."""
    threads: NonNegInt = 0
    """torch intra-op threads per worker (0: torch's default, which follows OMP_NUM_THREADS)."""
    trace: bool = False
    timeout_s: PosFloat = 300.0
    """How long a worker waits for the rendezvous and for any collective before failing."""
    divergence_factor: NonNegFloat = 10.0
    """Stop the run (exit 4) at a non-finite loss or one above this many times the first rounds' mean
    (runtime/divergence.py); 0: never."""

    progress_every_s: PosFloat = 0.5
    """How often a worker may report its progress within a round (runtime/progress.py): the
    launcher's log interval, at most 0.5 s."""
    allreduce_bucket_bytes: PosInt = ALLREDUCE_BUCKET_BYTES
    """Gradient AllReduce granularity of a replicated stage (runtime/reducer.py's BUCKET_BYTES)."""
    allreduce_overlap: bool = True
    """Start each bucket's AllReduce from the round's last backward (False: all after it, the path
    before issue 28; kept for bench/allreduce_overlap.py's comparison)."""
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"
    """Autocast dtype of the forward passes (`--precision`; runtime/accelerator.py): fp32 runs
    without autocast; fp16 with one loss scale shared by every stage; bf16 without a scale."""

    def learning_rate(self, round_index: int) -> float:
        """The rate of round `round_index` (0-based). A function of the round alone, so a resumed run
        and a replayed round use the rate the uninterrupted run would have. Counted from the cycle's
        first round (`schedule_start`): an extension's rounds take the rates a run of as many rounds
        takes from round 0."""
        step = max(0, round_index - self.schedule_start)
        if step < self.warmup_rounds:
            return self.lr * (step + 1) / self.warmup_rounds
        if self.lr_schedule == "constant":
            return self.lr
        span = max(1, self.rounds - self.schedule_start - self.warmup_rounds)
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * (step - self.warmup_rounds) / span))


class WorkerConfig(FrozenModel):
    device: str
    store_host: str
    store_port: Annotated[int, Field(ge=1, le=65535)]
    model: str
    model_input: ModelInput | None = None
    """A user model's input spec (the plan's); the worker declares it before building the model."""
    granularity: Literal["fine", "block"]
    schedule: Schedule
    options: TrainOptions
    accelerator: Literal["cpu", "cuda", "auto"] = "cpu"
    """The device's `accelerator:` from the cluster file, resolved by the worker on the device."""
    resume: bool = False
    """Load the checkpointed stage state (`resume/<stage>`) over the initial one (`init/<stage>`)."""
    recovery: "RecoveryConfig | None" = None
    """Heartbeats to a coordinator and pipeline replay on failure (runtime/ft_worker.py); None:
    any failure ends the run."""
    user_code: UserCode | None = None
    """The run's `--workdir` on this device and its user modules (runtime/workdir.py; the launcher
    fills it, runtime/worker_entry.py reads it); None: neither."""
    threads = property(lambda self: self.options.threads)  # what worker_entry reads of every worker config
    timeout_s = property(lambda self: self.options.timeout_s)


class RecoveryConfig(FrozenModel):
    """How a worker takes part in fault tolerance (docs/fault-tolerance.md)."""

    coordinator_host: str
    coordinator_port: Annotated[int, Field(ge=1, le=65535)]
    """The coordinator's heartbeat (UDP) address."""
    heartbeat_s: PosFloat = 1.0
    timeout_s: PosFloat = 3.0
    """The coordinator's silence threshold; a worker that hears no acknowledgement for 1.5x this
    stops cleanly (so within 2x of the coordinator's death)."""
    replicate_every: PosInt = 1
    """Snapshot and back up stage state every K rounds."""
    stall_timeout_s: PosFloat = 120.0
    """How long a stopped worker waits for the coordinator's new configuration."""


WorkerConfig.model_rebuild()
