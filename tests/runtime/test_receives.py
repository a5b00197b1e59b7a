"""Regression: a worker posts all of a round's receives before its first compute.

gloo moves a message only once its receive is posted; receives posted just before the compute
that needs them serialised every transfer with the compute before it (Env B lab: measured rounds
0.8 s against the simulator's 0.58 s). Threads over queues run the real Executor; the comm records
the order in which a device posts receives and runs forwards.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from hppctl.runtime.config import TrainOptions
from hppctl.runtime.data import SampleOrder, load_data
from hppctl.runtime.executor import Executor
from hppctl.runtime.stage import Stage
from hppctl.runtime.topology import Topology
from hppctl.runtime.worker import DataFeed, make_optimizer
from hppctl.schedule import check_schedule, schedule_for_plan
from tests.bipartition.threaded import Mailboxes, QueueComm
from tests.runtime.factories import make_plan


class RecordingComm(QueueComm):
    """The threaded queue comm that also logs, in the device's log, when a receive is posted."""

    def __init__(self, me, queues, log):
        super().__init__(me, queues)
        self.log = log

    def irecv(self, tensor, peer, tag):
        self.log.append("recv")
        return super().irecv(tensor, peer, tag)


def test_every_receive_is_posted_before_the_first_compute():
    plan = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 4), ["b"], [4]), ((4, 5), ["c"], [4])],
                     global_batch=16, micro_batch=4)
    schedule = schedule_for_plan(plan)
    check_schedule(schedule)
    topo = Topology.of(schedule)
    options = TrainOptions(rounds=1, dataset="synthetic", lr=0.1)
    data = load_data(options.dataset, plan.model)
    feed = DataFeed(data, SampleOrder(len(data.train), topo.global_batch, topo.micro_batch, options.seed))
    queues, logs, executors = Mailboxes(), defaultdict(list), {}
    for st in schedule.stages:
        device = st.devices[0]
        stage = Stage(plan.model, plan.granularity, *st.layers, seed=options.seed)
        log = logs[device]
        original = stage.module.forward
        stage.module.forward = lambda *v, _f=original, _log=log: (_log.append("F"), _f(*v))[1]
        executors[device] = Executor(device, schedule.actions[device], topo, stage,
                                     make_optimizer(stage.parameters(), options), RecordingComm(device, queues, log), feed)
    errors = []

    def work(ex):
        try:
            ex.run_round(0)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(ex,)) for ex in executors.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for device in ("b", "c"):
        log = logs[device]
        receives = sum(1 for a in schedule.actions[device] if a.kind in ("RA", "RG"))
        assert log.count("recv") == receives and receives > 0
        assert log.index("F") == receives, (device, log)  # every receive before the first forward
