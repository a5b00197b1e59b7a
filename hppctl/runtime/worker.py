"""A worker process: one device of a run. Started by the launcher (`hppctl run`), never by hand.

    python -m hppctl.runtime.worker      # reads one JSON line on stdin: {"token": …, "config": WorkerConfig}

Its body (the process's life is runtime/worker_entry.py's) builds the stage, forms the gloo groups,
runs its actions every round, and reports per-round metrics (`metrics/<round>/<device>`), stage state
for checkpoints (`ckpt/<round>/<stage>`, replica 0) and at the end (`final/<stage>`). A config with
`recovery` runs the fault-tolerant body (runtime/ft_worker.py) over the same `Worker`.
"""

from __future__ import annotations

import time

from hppctl.models.reports import RoundReport
from hppctl.runtime import wire
from hppctl.runtime.config import WorkerConfig, dropout_seed
from hppctl.runtime.training_state import TrainingState, build_training_state, load_feed, set_learning_rate
from hppctl.runtime.training_state import DataFeed, make_optimizer  # noqa: F401 (imported from here by tests, bench)
from hppctl.runtime.worker_entry import (WorkerContext, cpu_cgroup, load_blob, process_report, rss_bytes,
                                         run_worker_process, worker_main)


class StoreArrivals:
    """`executor.AllReduceArrivals` in the run's store: each replica sets `reduce_arrived(round,
    device)` as it reaches the round's AllReduce, and deletes its key of two rounds before (every
    replica had finished that AllReduce, so no one can still ask about it). On the failure path a
    store that no longer answers makes `missing` say nothing rather than hide the failure."""

    def __init__(self, store, device: str) -> None:
        self.store, self.device = store, device

    def reached(self, round_index: int) -> None:
        self.store.set(wire.reduce_arrived(round_index, self.device), "1")
        if round_index >= 2:
            self.store.delete_key(wire.reduce_arrived(round_index - 2, self.device))

    def missing(self, round_index: int, devices) -> list[str]:
        try:
            return [d for d in devices if not self.store.check([wire.reduce_arrived(round_index, d)])]
        except Exception:  # noqa: BLE001 - torch's store errors vary; the AllReduce's own failure is the news
            return []


class Worker:
    """One device's training state in a schedule, and what a round does with it."""

    def __init__(self, config: WorkerConfig, store) -> None:
        from hppctl.zoo import trace

        self.config, self.store, self.device = config, store, config.device
        self.cgroup = cpu_cgroup()
        trace(config.model, "train")  # imports the model's libraries; the stage reuses the trace
        self.follow(config.schedule)
        feed = load_feed(config, config.schedule, self.device)
        self.baseline_rss = rss_bytes()
        """Resident memory before any weight exists: interpreter, torch, the model's libraries and meta
        trace, the dataset. Peak minus this is what the plan's memory prediction (Eq. 3) covers."""
        initial = load_blob(store, wire.init(self.stage_index))  # dropped once the stage holds its tensors
        self.adopt(build_training_state(config, config.schedule, self.stage_index, initial, feed))
        del initial
        if config.resume:  # the checkpointed state over the initial one
            state = load_blob(store, wire.resume(self.stage_index))
            self.stage.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])

    def follow(self, schedule) -> None:
        """Train on `schedule` (at start, or after a re-plan): its topology and this device's place in it."""
        from hppctl.runtime.topology import Topology

        self.config = self.config.model_copy(update={"schedule": schedule})
        self.topo = Topology.of(schedule)
        if self.device in self.topo.devices:
            self.rank, self.stage_index = self.topo.rank(self.device), self.topo.stage_of[self.device]

    def adopt(self, state: TrainingState) -> None:
        """Train from now on with `state`'s stage, optimizer, feed and executor class."""
        self.stage, self.optimizer, self.feed = state.stage, state.optimizer, state.feed
        self.executor_class = state.executor_class

    def new_executor(self, comm):
        """The executor of this device's actions (the plain and the fault-tolerant worker's alike)."""
        return self.executor_class(self.device, self.config.schedule.actions[self.device], self.topo, self.stage,
                                   self.optimizer, comm, self.feed, trace=self.config.options.trace,
                                   bucket_bytes=self.config.options.allreduce_bucket_bytes,
                                   overlap_allreduce=self.config.options.allreduce_overlap)

    def state_blob(self, completed_rounds: int) -> bytes:
        from hppctl.runtime.replication import to_bytes

        return to_bytes({"round": completed_rounds, "stage": self.stage_index,
                         "layers": [self.stage.start, self.stage.end],
                         "model": self.stage.state_dict(), "optimizer": self.optimizer.state_dict()})

    @property
    def primary(self) -> bool:
        """Replica 0 of its stage: the one that hands the stage's state in."""
        return self.topo.replica_index(self.device) == 0

    def train(self, comm) -> None:
        from hppctl.runtime.progress import StepReporter

        opts = self.config.options
        executor = self.new_executor(comm)
        if len(self.topo.groups[self.stage_index]) > 2:  # with one other replica, a timeout names it already
            executor.arrivals = StoreArrivals(self.store, self.device)
        executor.on_step = StepReporter(self.store, self.device, "micro-batches", opts.progress_every_s).report
        for r in range(opts.start_round, opts.rounds):
            self.publish_round(self.run_round(executor, r))
        self.publish_final()

    def run_round(self, executor, r: int):
        from hppctl.runtime.accelerator import seed_generators

        opts = self.config.options
        cpu = time.process_time()
        seed_generators(dropout_seed(opts.seed, r, self.rank), executor.accelerator)
        set_learning_rate(self.optimizer, opts.learning_rate(r))
        stats = executor.run_round(r)
        stats.cpu_s = time.process_time() - cpu
        return stats

    def publish_round(self, stats, **extra) -> None:
        """The round's metrics report (with `extra`), and the stage state when a checkpoint is due."""
        from hppctl.runtime.bootstrap import put_blob

        self.store.set(wire.metrics(stats.round, self.device), self.report(stats, **extra).model_dump_json())
        completed = stats.round + 1
        if self.primary and self.checkpoint_due(completed):
            put_blob(self.store, wire.ckpt(completed, self.stage_index), self.state_blob(completed))

    def publish_final(self) -> None:
        from hppctl.runtime.bootstrap import put_blob

        if self.primary:
            put_blob(self.store, wire.final(self.stage_index), self.state_blob(self.config.options.rounds))

    def report(self, stats, **extra) -> RoundReport:
        """The round's metrics report (`metrics/<round>/<device>`); `extra`: the fault-tolerant worker's fields."""
        return RoundReport(**vars(stats), device=self.device, stage=self.stage_index, **process_report(),
                           baseline_rss_bytes=self.baseline_rss, cgroup=self.cgroup,
                           lr=self.config.options.learning_rate(stats.round), **extra)

    def checkpoint_due(self, completed: int) -> bool:
        from hppctl.runtime.checkpoint import is_checkpoint_round

        opts = self.config.options
        return is_checkpoint_round(completed, opts.checkpoint_every, opts.rounds)


def train(ctx: WorkerContext) -> None:
    """The body of a plain training worker: build, form the gloo groups, train every round."""
    from hppctl.runtime import bootstrap

    config = ctx.config
    worker = Worker(config, ctx.store)
    topo = worker.topo
    groups = bootstrap.init_process_groups(
        ctx.store, worker.rank, topo.world_size, [topo.group_ranks(p) for p in range(topo.num_stages)],
        worker.stage_index, store_host=config.store_host, timeout_s=config.timeout_s)
    worker.train(bootstrap.DistComm({d: topo.rank(d) for d in topo.devices}, groups))


def run_worker(config: WorkerConfig, token: str) -> int:
    """Join, train (fault-tolerant with a coordinator), report; returns the exit code."""
    if config.recovery is not None:
        from hppctl.runtime.ft_worker import run_ft

        return run_ft(config, token, Worker)
    return run_worker_process(config, token, train)


if __name__ == "__main__":
    worker_main(WorkerConfig, run_worker)
