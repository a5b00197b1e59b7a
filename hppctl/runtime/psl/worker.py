"""A PSL worker: one client or helper of a `hppctl psl run`. Started by the launcher, never by hand.

    python -m hppctl.runtime.psl.worker      # reads one JSON line on stdin: {"token": …, "config": PslWorkerConfig}

It connects to the launcher's store and joins with the run's token (runtime/bootstrap.py, as HPP
workers do), takes its parts' initial weights from the store (`init/<start>-<end>`: the launcher
cut them out of one model built from the seed, so every client starts from the same model), joins
the gloo group (rank = its place in `PslTopology.devices`), and runs the rounds: every round is
`local_batches` batch updates — each after a barrier, so that every client starts its batch
together as in the paper's batch makespan — then FedAvg (psl/fedavg.py). It reports each round as
`metrics/<round>/<device>`, its state (parts and optimizers, `state_blob`) as `ckpt/<round>/<rank>`
when a checkpoint is due and as `final/<device>` at the end, then `done/<device>`; any exception
becomes `failed/<device>` (traceback on stderr) and exit code 1. A resumed worker (`config.resume`)
loads its state from `resume/<rank>` over the initial parts and trains from `start_round` on: batch
`step`'s samples and dropout draws follow from (seed, step) alone, so nothing else carries over.
"""

from __future__ import annotations

import time
from functools import partial

from hppctl.models.reports import PslRoundReport
from hppctl.runtime import wire
from hppctl.runtime.config import dropout_seed
from hppctl.runtime.psl.config import PslWorkerConfig
from hppctl.runtime.training_state import make_optimizer
from hppctl.runtime.worker_entry import WorkerContext, cpu_cgroup, load_blob, process_report, run_worker_process, \
    worker_main


def build_part(config: PslWorkerConfig, store, start: int, end: int):
    from hppctl.runtime.stage import Stage

    plan = config.plan
    return Stage(plan.model, plan.granularity, start, end, tensors=load_blob(store, wire.init_part(start, end)))


def num_layers(model: str, granularity: str) -> int:
    from hppctl.zoo import layer_costs

    return len(layer_costs(model, granularity))


class BatchBarrier:
    """Every device of the run meets here before each batch, through the run's store: each sets its
    `batch_ready(step, device)` key and waits for everyone's. gloo's barrier cannot say who is
    missing ("Timed out waiting … for recv operation"); this one names the devices whose key never
    came. A device deletes its key of the step before once it has passed a step: everyone had
    left that barrier by then (they set this step's keys after it), so the store holds at most two
    steps' keys."""

    def __init__(self, store, device: str, everyone: list[str], timeout_s: float) -> None:
        self.store, self.device, self.everyone, self.timeout_s = store, device, list(everyone), timeout_s

    def wait(self, step: int) -> None:
        from datetime import timedelta

        self.store.set(wire.batch_ready(step, self.device), "1")
        keys = [wire.batch_ready(step, d) for d in self.everyone]
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout_s))
        except RuntimeError as timed_out:  # torch's DistStoreError: a timeout, naming no key
            try:
                missing = [d for d, key in zip(self.everyone, keys) if not self.store.check([key])]
            except RuntimeError:  # the store itself stopped answering: that is the news
                raise timed_out from None
            if not missing:  # they all came as the wait gave up
                return self._passed(step)
            raise RuntimeError(f"{self.device}: waiting for every device before batch {step}: nothing from "
                               f"{', '.join(missing)} within {self.timeout_s:g} s") from None
        self._passed(step)

    def _passed(self, step: int) -> None:
        if step > 0:
            self.store.delete_key(wire.batch_ready(step - 1, self.device))


class PslWorker:
    """The device's role (client or helper) and what a round does with it."""

    def __init__(self, config: PslWorkerConfig, store) -> None:
        from hppctl.runtime.psl.fedavg import holder_groups
        from hppctl.runtime.psl.topology import PslTopology

        self.config, self.store, self.device = config, store, config.device
        self.topo = PslTopology.of(config.plan)
        self.barrier = BatchBarrier(store, self.device, list(self.topo.devices), config.timeout_s)
        plan = config.plan
        self.holder_groups = holder_groups(self.topo, plan.model, plan.granularity, num_layers(plan.model, plan.granularity))
        self.gloo_groups: dict[tuple[int, ...], object] = {}
        self.weights = dict(zip(config.plan.clients, config.fedavg_weights))
        if self.device in self.topo.clients:
            self.role, self.holdings = self._client()
        else:
            self.role, self.holdings = self._helper()

    def _client(self):
        from hppctl.runtime.data import load_data
        from hppctl.runtime.psl.data import ClientSamples, shards
        from hppctl.runtime.psl.roles import Client

        plan, opts, topo = self.config.plan, self.config.options, self.topo
        index = topo.clients.index(self.device)
        self.data = load_data(opts.train.dataset, plan.model)
        s1, s2 = topo.cuts[self.device]
        part1 = build_part(self.config, self.store, 0, s1)
        part3 = build_part(self.config, self.store, s2, num_layers(plan.model, plan.granularity))
        shard = shards(len(self.data.train), opts.shares or [1.0] * len(plan.clients), opts.train.seed)[index]
        samples = ClientSamples(shard, plan.batch, opts.train.seed, index)
        optimizer = make_optimizer(part1.parameters() + part3.parameters(), opts.train)
        helper = topo.helper_of[self.device]
        client = Client(part1, part3, optimizer, helper, topo.rank(helper), samples, self.data.train, plan.batch)
        self.parts = {"part1": part1, "part3": part3}
        self.optimizers = {"client": optimizer}
        w = self.weights[self.device]
        return client, [(w, part1.module), (w, part3.module)]

    def _helper(self):
        from hppctl.runtime.psl.roles import Helper
        from hppctl.runtime.psl.topology import task_tails

        plan, topo = self.config.plan, self.topo
        copies = {}
        for client in topo.clients_of(self.device):
            part2 = build_part(self.config, self.store, *topo.cuts[client])
            copies[client] = (part2, make_optimizer(part2.parameters(), self.config.options.train), topo.rank(client))
        self.parts = {c: stage for c, (stage, _, _) in copies.items()}
        self.optimizers = {c: optimizer for c, (_, optimizer, _) in copies.items()}
        tails = task_tails(plan, self.device) if self.config.options.order == "ltf" else None
        helper = Helper(copies, list(topo.orders[self.device]), plan.batch, tails, self.config.options.train.timeout_s)
        return helper, [(self.weights[c], copies[c][0].module) for c in copies]

    def make_groups(self, timeout_s: float) -> None:
        """One gloo group per set of ranks sharing tensors to average; every rank creates every group,
        in the same order (torch requires it), and uses those it belongs to."""
        import datetime

        import torch.distributed as dist

        for group in self.holder_groups:
            if len(group.ranks) > 1:
                self.gloo_groups[group.ranks] = dist.new_group(list(group.ranks), backend="gloo",
                                                               timeout=datetime.timedelta(seconds=timeout_s))

    def _allreduce(self, tensor, group) -> None:
        import torch.distributed as dist

        from hppctl.runtime.executor import naming

        others = [self.topo.devices[r] for r in group.ranks if self.topo.devices[r] != self.device]
        with naming(f"averaging the model (FedAvg) with {', '.join(others)}"):  # gloo names no one
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.gloo_groups[group.ranks])

    def run_round(self, r: int, cgroup: str) -> PslRoundReport:
        import torch

        from hppctl.runtime.accelerator import seed_generators
        from hppctl.runtime.psl.fedavg import fedavg

        opts = self.config.options
        started, cpu = time.time(), time.process_time()
        batches = []
        for k in range(opts.local_batches):
            step = r * opts.local_batches + k
            seed_generators(dropout_seed(opts.train.seed, step, self.topo.rank(self.device)), torch.device("cpu"))
            self.barrier.wait(step)
            batches.append(vars(self.role.run_batch(step)))
        begin = time.perf_counter()
        fedavg(self.holder_groups, self.holdings, self.topo.rank(self.device), self._allreduce)
        fedavg_s = time.perf_counter() - begin
        return PslRoundReport.model_validate(
            {"round": r, "device": self.device, "role": "client" if self.device in self.topo.clients else "helper",
             "started_at": started, "duration_s": time.time() - started, "cpu_s": time.process_time() - cpu,
             "fedavg_s": fedavg_s, "batches": batches, **process_report(), "cgroup": cgroup}, strict=False)

    def state_blob(self) -> bytes:
        """This device's training state: its parts (a client: part1, part3; a helper: one part-2 copy per
        client) and its optimizers (a client: one over parts 1 and 3; a helper: one per copy)."""
        from hppctl.runtime.replication import to_bytes

        return to_bytes({"parts": {name: stage.state_dict() for name, stage in self.parts.items()},
                         "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()}})

    def load_state(self, state: dict) -> None:
        """A checkpointed `state_blob` over the initial parts (the launcher checked its names and shapes)."""
        for name, stage in self.parts.items():
            stage.module.load_state_dict(state["parts"][name])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])


def serve(ctx: WorkerContext) -> None:
    """The body of a PSL worker: its role, the gloo groups, the rounds, the final parts."""
    from hppctl.runtime import bootstrap
    from hppctl.runtime.checkpoint import is_checkpoint_round

    config, store, cgroup = ctx.config, ctx.store, cpu_cgroup()
    worker = PslWorker(config, store)
    rank, train = worker.topo.rank(config.device), config.options.train
    if config.resume:
        worker.load_state(load_blob(store, wire.resume(rank)))
    bootstrap.init_process_groups(store, rank, worker.topo.world_size, [], 0,
                                  store_host=config.store_host, timeout_s=config.timeout_s)
    worker.make_groups(config.timeout_s)
    for r in range(train.start_round, train.rounds):
        store.set(wire.metrics(r, config.device), worker.run_round(r, cgroup).model_dump_json())
        if is_checkpoint_round(r + 1, config.checkpoint_every, train.rounds):
            bootstrap.put_blob(store, wire.ckpt(r + 1, rank), worker.state_blob())
    bootstrap.put_blob(store, wire.final(config.device), worker.state_blob())



if __name__ == "__main__":
    worker_main(PslWorkerConfig, partial(run_worker_process, body=serve))
