"""Run a Bi-Partition plan's workers as threads of this process over queues (no torch.distributed):
the executor's logic, fast enough for many plans. The gloo test runs the real `hppctl run` path."""

from __future__ import annotations

import queue
import threading

import torch

from hppctl.runtime.bipartition import BiExecutor, BiStage
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.data import SampleOrder, load_data
from hppctl.runtime.topology import Topology
from hppctl.runtime.worker import DataFeed, make_optimizer
from hppctl.schedule import check_schedule, schedule_for_plan


class _Done:
    def wait(self):
        return None

    def is_completed(self):
        return True


class _Recv:
    def __init__(self, q: queue.Queue, tensor: torch.Tensor):
        self.q, self.tensor, self.done = q, tensor, False

    def wait(self):
        if not self.done:
            self.tensor.copy_(self.q.get(timeout=60))
            self.done = True

    def is_completed(self):
        return self.done


class Mailboxes:
    """One FIFO per (src, dst, tag), created under a lock: a defaultdict's miss is not atomic across
    threads, and two threads creating the same queue at once lost a message (a flaky 60 s hang)."""

    def __init__(self) -> None:
        self.lock, self.queues = threading.Lock(), {}

    def __getitem__(self, key) -> queue.Queue:
        with self.lock:
            return self.queues.setdefault(key, queue.Queue())


class QueueComm:
    def __init__(self, me: str, queues: Mailboxes):
        # Only Mailboxes: a plain defaultdict(queue.Queue) shared by the threads loses a message now
        # and then (CI: test_receives hung 60 s on a receive whose queue another thread replaced).
        if not isinstance(queues, Mailboxes):
            raise TypeError(f"QueueComm needs Mailboxes, got {type(queues).__name__}")
        self.me, self.queues = me, queues

    def isend(self, tensor, peer, tag):
        self.queues[(self.me, peer, tag)].put(tensor.detach().clone())
        return _Done()

    def irecv(self, tensor, peer, tag):
        return _Recv(self.queues[(peer, self.me, tag)], tensor)


def train_threaded(plan, options: TrainOptions) -> dict[str, torch.Tensor]:
    schedule = schedule_for_plan(plan)
    check_schedule(schedule)
    topo = Topology.of(schedule)
    data = load_data(options.dataset, plan.model)
    order = SampleOrder(len(data.train), topo.global_batch, topo.micro_batch, options.seed)
    queues = Mailboxes()
    executors, errors = {}, []
    for p, st in enumerate(schedule.stages):
        device = st.devices[0]
        stage = BiStage(plan.model, plan.granularity, st.layers, st.backward_layers or st.layers,
                        num_layers=plan.num_layers, seed=options.seed)
        executors[device] = BiExecutor(device, schedule.actions[device], topo, stage,
                                       make_optimizer(stage.parameters(), options), QueueComm(device, queues),
                                       DataFeed(data, order))

    def work(device):
        try:
            for r in range(options.rounds):
                executors[device].run_round(r)
        except BaseException as e:  # reported by the caller
            errors.append((device, e))

    threads = [threading.Thread(target=work, args=(d,)) for d in executors]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0][1]
    state: dict[str, torch.Tensor] = {}
    for ex in executors.values():
        part = ex.stage.state_dict()
        assert not set(part) & set(state), sorted(set(part) & set(state))
        state.update(part)
    return state
