"""What the launcher tells each PSL worker: one JSON line on its stdin, with the run's token beside it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hppctl.models.base import FrozenModel
from hppctl.models.cluster import DeviceName
from hppctl.models.psl import PslPlan
from hppctl.runtime.config import PosFloat, PosInt, TrainOptions
from hppctl.runtime.workdir import UserCode


class PslOptions(FrozenModel):
    """What a PSL run adds to the training options every worker shares (`TrainOptions`: dataset,
    seed, rounds, optimizer, lr, momentum, weight decay, threads, timeout)."""

    train: TrainOptions
    local_batches: PosInt = 1
    """Batch updates each client makes per round, before the round's FedAvg."""
    shares: Annotated[list[PosFloat], Field(min_length=1)] | None = None
    """Relative sizes of the clients' data shards (plan order); None: equal shards."""
    order: Literal["plan", "ltf"] = "plan"
    """How helpers pick their next task: `plan`, the plan's per-helper order; `ltf`, online among the
    tasks whose input has arrived, the one with the most client work left after it."""


class PslWorkerConfig(FrozenModel):
    device: DeviceName
    store_host: str
    store_port: Annotated[int, Field(ge=1, le=65535)]
    plan: PslPlan
    options: PslOptions
    fedavg_weights: list[Annotated[float, Field(ge=0, le=1)]]
    """w_j = n_j / Σ n per client (plan order), from the shard sizes; helpers need them and never load data."""
    checkpoint_every: Annotated[int, Field(ge=0)] = 0
    """Hand the state in every K rounds (`ckpt/<round>/<rank>`); 0: no checkpoints."""
    resume: bool = False
    """Load the state at `resume/<rank>` (a checkpoint round) and train from `options.train.start_round`."""
    user_code: UserCode | None = None
    """The run's `--workdir` on this device and its user modules (runtime/workdir.py; the launcher
    fills it, runtime/worker_entry.py reads it); None: neither."""
    threads = property(lambda self: self.options.train.threads)  # what worker_entry reads of every worker config
    timeout_s = property(lambda self: self.options.train.timeout_s)
