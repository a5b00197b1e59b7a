"""One factory builds a training worker's stage, optimizer, feed and executor: the fault-tolerant
worker's rebuild after a re-plan gets what the plain worker builds for the same schedule.

Before runtime/training_state.py, `FtRun._rebuild` made a plain `Stage` and `Executor`
whatever the schedule (a Bi-Partition stage came back as a plain one, an nf1b window as the
synchronous executor). Real `Worker`s over an in-process store; no process groups are needed to
build (the executor only keeps its comm).
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.distributed as dist

from hppctl.runtime import bootstrap, wire
from hppctl.runtime.config import RecoveryConfig, TrainOptions, WorkerConfig
from hppctl.runtime.ft_worker import FtRun
from hppctl.runtime.replication import stage_state
from hppctl.runtime.stage import initial_stage_tensors
from hppctl.runtime.worker import Worker
from hppctl.schedule import schedule_for_plan
from tests.bipartition.factories import bi_plan
from tests.timeprest.factories import nf1b


def bipartition_schedule():
    return schedule_for_plan(bi_plan("tiny-mlp", [0, 3, 5], [0, 2, 5], ["s0", "s1"], global_batch=16, micro_batch=4))


def async_schedule():
    return nf1b(2, 2, 2)


def worker_for(schedule, device: str) -> Worker:
    store = dist.HashStore()
    held = [(min(s.layers[0], (s.backward_layers or s.layers)[0]), max(s.layers[1], (s.backward_layers or s.layers)[1]))
            for s in schedule.stages]
    for index, tensors in enumerate(initial_stage_tensors("tiny-mlp", "fine", held, seed=0)):
        buf = io.BytesIO()
        torch.save(tensors, buf)
        bootstrap.put_blob(store, wire.init(index), buf.getvalue())
    config = WorkerConfig(device=device, store_host="127.0.0.1", store_port=1, model="tiny-mlp", granularity="fine",
                          schedule=schedule, options=TrainOptions(rounds=2, dataset="synthetic", threads=1),
                          recovery=RecoveryConfig(coordinator_host="127.0.0.1", coordinator_port=1))
    return Worker(config, store)


@pytest.mark.parametrize("schedule", [bipartition_schedule, async_schedule], ids=["bipartition", "nf1b"])
@pytest.mark.parametrize("device", ["s0", "s1"])
def test_the_rebuild_after_a_replan_builds_what_the_plain_worker_builds(schedule, device):
    worker = worker_for(schedule(), device)
    built_stage, built_executor = type(worker.stage), type(worker.new_executor(None))
    before = {k: v.clone() for k, v in worker.stage.state_dict().items()}
    run = FtRun(worker, worker.store, beats=None)
    run.comm = None
    run._rebuild(stage_state(worker.stage, worker.optimizer))
    assert type(worker.stage) is built_stage and type(run.executor) is built_executor
    assert built_executor.__name__ != "Executor"  # the schedules above are not the synchronous one
    after = worker.stage.state_dict()
    assert sorted(after) == sorted(before)
    for name in before:
        torch.testing.assert_close(after[name], before[name])
