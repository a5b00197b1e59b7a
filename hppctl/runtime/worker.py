"""A worker process: one device of a run. Started by the launcher (`hppctl run`), never by hand.

    python -m hppctl.runtime.worker      # reads one JSON line on stdin: {"token": …, "config": WorkerConfig}

It connects to the launcher's store, joins with the token, builds its stage, creates the gloo
groups, runs its action list for every round, and reports through the store: per-round metrics
(`metrics/<round>/<device>`), stage state for checkpoints (`ckpt/<round>/<stage>`, replica 0 of each
stage) and at the end (`final/<stage>`), then `done/<device>`. Any exception is reported as
`failed/<device>` with the traceback on stderr, and the exit code is 1.
"""

from __future__ import annotations

import io
import json
import os
import resource
import socket
import sys
import time
import traceback

from hppctl.allocator import steady_heap
from hppctl.runtime.config import WorkerConfig


def rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_cgroup() -> str:
    """The cgroup whose CPU controller holds this process (v1 `cpu`, else the v2 unified path)."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return ""
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Worker:
    def __init__(self, config: WorkerConfig, store) -> None:
        import torch

        from hppctl.runtime.data import SampleOrder, load_data
        from hppctl.runtime.stage import Stage
        from hppctl.runtime.topology import Topology

        self.config, self.store, self.device = config, store, config.device
        self.cgroup = cpu_cgroup()
        opts = config.options
        from hppctl.zoo import trace

        trace(config.model, "train")  # imports the model's libraries; the stage reuses the trace
        self.topo = Topology.of(config.schedule)
        self.rank = self.topo.rank(self.device)
        self.stage_index = self.topo.stage_of[self.device]
        self.feed = None
        self.bipartition = any(s.backward_layers is not None for s in config.schedule.stages)
        """Bi-Partition (runtime/bipartition.py): any worker may read inputs or compute the loss."""
        if self.topo.is_head(self.device) or self.topo.is_tail(self.device) or self.bipartition:
            data = load_data(opts.dataset, config.model)
            order = SampleOrder(len(data.train), self.topo.global_batch, self.topo.micro_batch, opts.seed)
            self.feed = DataFeed(data, order)
        self.baseline_rss = rss_bytes()
        """Resident memory before any weight exists: interpreter, torch, the model's libraries and meta
        trace, the dataset. Peak minus this is what the plan's memory prediction (Eq. 3) covers."""
        layers = config.schedule.stages[self.stage_index].layers
        blob = self._get_blob(f"init/{self.stage_index}")
        initial = torch.load(io.BytesIO(blob), weights_only=True)
        del blob
        if self.bipartition:
            from hppctl.runtime.bipartition import BiStage

            backward = config.schedule.stages[self.stage_index].backward_layers or layers
            self.stage = BiStage(config.model, config.granularity, layers, backward,
                                 num_layers=config.schedule.stages[-1].layers[1], tensors=initial)
        else:
            self.stage = Stage(config.model, config.granularity, layers[0], layers[1], tensors=initial)
        del initial
        self.optimizer = make_optimizer(self.stage.parameters(), opts)
        if config.resume:
            self.load_state(torch.load(io.BytesIO(self._get_blob(f"resume/{self.stage_index}")), weights_only=True))

    def _get_blob(self, key: str) -> bytes:
        from hppctl.runtime.bootstrap import get_blob

        return get_blob(self.store, key)

    def load_state(self, state: dict) -> None:
        self.stage.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def state_blob(self, completed_rounds: int) -> bytes:
        import torch

        buf = io.BytesIO()
        torch.save({"round": completed_rounds, "stage": self.stage_index,
                    "layers": [self.stage.start, self.stage.end],
                    "model": self.stage.state_dict(), "optimizer": self.optimizer.state_dict()}, buf)
        return buf.getvalue()

    def train(self, comm) -> None:
        from hppctl.runtime.bootstrap import put_blob

        opts = self.config.options
        executor = self._executor_class()(self.device, self.config.schedule.actions[self.device], self.topo,
                                          self.stage, self.optimizer, comm, self.feed, trace=opts.trace)
        from hppctl.runtime.progress import StepReporter
        executor.on_step = StepReporter(self.store, self.device, "micro-batches", opts.progress_every_s).report
        primary = self.topo.replica_index(self.device) == 0
        for r in range(opts.start_round, opts.rounds):
            stats = self.run_round(executor, r)
            self.store.set(f"metrics/{r}/{self.device}", json.dumps(self.report(stats)))
            if primary and self.checkpoint_due(r + 1):
                put_blob(self.store, f"ckpt/{r + 1}/{self.stage_index}", self.state_blob(r + 1))
        if primary:
            put_blob(self.store, f"final/{self.stage_index}", self.state_blob(opts.rounds))

    def _executor_class(self):
        """Asynchronous windows (nf1b, pipedream: docs/timeprest.md), Bi-Partition stages, or the plain executor."""
        if self.config.schedule.micro_batches_per_update is not None:
            from hppctl.runtime.async_exec import async_executor_class
            return async_executor_class(self.config.schedule)
        if self.bipartition:
            from hppctl.runtime.bipartition import BiExecutor
            return BiExecutor
        from hppctl.runtime.executor import Executor
        return Executor

    def run_round(self, executor, r: int):
        import torch

        opts = self.config.options
        cpu = time.process_time()
        torch.manual_seed(opts.seed * 1_000_003 + r * 1_009 + self.rank)  # dropout masks, reproducible on resume
        set_learning_rate(self.optimizer, opts.learning_rate(r))
        stats = executor.run_round(r)
        stats.cpu_s = time.process_time() - cpu
        return stats

    def report(self, stats) -> dict:
        """The round's metrics report (`metrics/<round>/<device>`)."""
        report = stats.as_json()
        report.update(device=self.device, stage=self.stage_index, rss_bytes=rss_bytes(),
                      peak_rss_bytes=peak_rss_bytes(), baseline_rss_bytes=self.baseline_rss,
                      host=socket.gethostname(), cgroup=self.cgroup,
                      lr=self.config.options.learning_rate(stats.round))
        if self.config.options.trace:
            report["spans"] = [s.__dict__ for s in stats.spans]
        return report

    def checkpoint_due(self, completed: int) -> bool:
        opts = self.config.options
        return bool(opts.checkpoint_every and completed % opts.checkpoint_every == 0 and completed < opts.rounds)


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


def run_worker(config: WorkerConfig, token: str) -> int:
    """Join, train, report; returns the exit code."""
    import torch

    from hppctl.runtime import bootstrap

    opts = config.options
    if opts.threads:
        torch.set_num_threads(opts.threads)
    if config.recovery is not None:
        from hppctl.runtime.recovery_worker import run_resilient

        return run_resilient(config, token)
    store = bootstrap.connect_store(config.store_host, config.store_port, token, timeout_s=opts.timeout_s)
    store.set(f"pid/{config.device}", f"{socket.gethostname()} {os.getpid()}")
    try:
        bootstrap.join(store, token, config.device, timeout_s=opts.timeout_s)
        worker = Worker(config, store)
        topo = worker.topo
        groups = bootstrap.init_process_groups(
            store, worker.rank, topo.world_size, [topo.group_ranks(p) for p in range(topo.num_stages)],
            worker.stage_index, store_host=config.store_host, timeout_s=opts.timeout_s)
        try:
            comm = bootstrap.DistComm({d: topo.rank(d) for d in topo.devices}, groups)
            worker.train(comm)
        finally:
            bootstrap.destroy_process_groups()
        store.set(f"done/{config.device}", str(time.time()))
        return 0
    except BaseException as e:
        return report_failure(store, config.device, e)


def report_failure(store, device: str, error: BaseException) -> int:
    """Print the traceback, tell the launcher through its store; the worker's exit code (1)."""
    traceback.print_exc()
    try:
        store.set(f"failed/{device}", f"{error.__class__.__name__}: {error}"[:2000])
    except Exception:  # the store may be gone with the launcher; the exit code still says it
        pass
    return 1


def worker_main(config_type, run) -> None:
    """A worker module's entry point: one JSON line {token, config} on stdin, then `run(config, token)`."""
    steady_heap()  # as the profile was measured (hppctl/allocator.py)
    line = sys.stdin.readline()
    try:
        doc = json.loads(line)
        token = doc["token"]
        config = config_type.model_validate_json(json.dumps(doc["config"]))
    except (ValueError, KeyError) as e:
        print(f"error: worker needs one JSON line {{token, config}} on stdin ({e})", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(config, token))


def main() -> None:
    worker_main(WorkerConfig, run_worker)


if __name__ == "__main__":
    main()
