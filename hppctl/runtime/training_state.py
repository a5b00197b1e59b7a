"""What a training worker trains: its stage, the stage's optimizer, the data feed, the executor class.

`build_training_state` makes all of it from (config, schedule, stage index, tensors): the plain
worker (runtime/worker.py) at start, the fault-tolerant one (runtime/ft_worker.py) again after
every re-plan, so both build the same stage (Bi-Partition or plain) and executor for a schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from hppctl.runtime.config import WorkerConfig


class DataFeed:
    """`executor.Feed` over a dataset and its sample order."""

    def __init__(self, data, order) -> None:
        self.data, self.order = data, order

    def inputs(self, round_index: int, micro_batch: int, lo: int, hi: int):
        return self.data.train.take(self.order.indices(round_index, micro_batch, lo, hi))[0]

    def labels(self, round_index: int, micro_batch: int, lo: int, hi: int):
        return self.data.train.take(self.order.indices(round_index, micro_batch, lo, hi))[1]


def set_learning_rate(optimizer, lr: float) -> None:
    """Before each round: the schedule's rate for it (a resumed optimizer state carries an old one)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


class NoParameters:
    """The optimizer of a stage without parameters (say, a lone activation layer)."""

    param_groups: list = []

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def make_optimizer(params, opts):
    import torch

    params = list(params)
    if not params:
        return NoParameters()
    if opts.optimizer == "adam":
        return torch.optim.Adam(params, lr=opts.lr, weight_decay=opts.weight_decay)
    return torch.optim.SGD(params, lr=opts.lr, momentum=opts.momentum, weight_decay=opts.weight_decay)


def is_bipartition(schedule) -> bool:
    """Bi-Partition (runtime/bipartition.py): any worker may read inputs or compute the loss."""
    return any(s.backward_layers is not None for s in schedule.stages)


def load_feed(config: WorkerConfig, schedule, device: str) -> DataFeed | None:
    """`device`'s data feed: the head reads inputs, the tail labels, every device under Bi-Partition."""
    from hppctl.runtime.data import SampleOrder, load_data
    from hppctl.runtime.topology import Topology

    topo = Topology.of(schedule)
    if not (topo.is_head(device) or topo.is_tail(device) or is_bipartition(schedule)):
        return None
    data = load_data(config.options.dataset, config.model)
    return DataFeed(data, SampleOrder(len(data.train), topo.global_batch, topo.micro_batch, config.options.seed))


def executor_class(schedule):
    """Asynchronous windows (nf1b, pipedream: docs/timeprest.md), Bi-Partition stages, or the plain executor."""
    if schedule.micro_batches_per_update is not None:
        from hppctl.runtime.async_exec import async_executor_class
        return async_executor_class(schedule)
    if is_bipartition(schedule):
        from hppctl.runtime.bipartition import BiExecutor
        return BiExecutor
    from hppctl.runtime.executor import Executor
    return Executor


@dataclass
class TrainingState:
    stage: object
    optimizer: object
    feed: DataFeed | None
    executor_class: type
    """Called as the executor class; bound to the device and precision below."""
    device: object = None
    """The `torch.device` the stage computes on (runtime/accelerator.py)."""
    precision: object = None
    """The run's `accelerator.Precision` on that device."""


def build_training_state(config: WorkerConfig, schedule, stage_index: int, tensors: dict,
                         feed: DataFeed | None = None, *, device=None) -> TrainingState:
    """Stage `stage_index` of `schedule` holding `tensors` on the worker's accelerator, a fresh
    optimizer over it (its state follows the parameters onto the device), the device's data feed
    (`feed` when the worker has one already), and the executor class for the schedule, bound to the
    device and the run's precision. `device`: a `torch.device` to use instead of resolving the
    config's `accelerator` here (tests: `meta` for shapes)."""
    from functools import partial

    from hppctl.runtime.accelerator import precision_for, resolve
    from hppctl.runtime.stage import Stage

    if device is None:
        device = resolve(config.accelerator, device_name=config.device)
    precision = precision_for(config.options.precision, device)
    spec = schedule.stages[stage_index]
    if is_bipartition(schedule):
        from hppctl.runtime.bipartition import BiStage

        stage = BiStage(config.model, config.granularity, spec.layers, spec.backward_layers or spec.layers,
                        num_layers=schedule.stages[-1].layers[1], tensors=tensors, device=device)
    else:
        stage = Stage(config.model, config.granularity, spec.layers[0], spec.layers[1], tensors=tensors, device=device)
    if feed is None:
        feed = load_feed(config, schedule, config.device)
    executor = partial(executor_class(schedule), accelerator=device, precision=precision)
    return TrainingState(stage, make_optimizer(stage.parameters(), config.options), feed, executor, device, precision)
