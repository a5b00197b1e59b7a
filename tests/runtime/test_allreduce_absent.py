"""A replica that never reaches a round's AllReduce is named by those left waiting in it, among three
or more (tests/runtime/test_silent_peer.py covers two, where "the other one" is the only choice).
gloo's timeout names no peer, and the message named every other replica ("all-reducing stage 0's
gradients with b, c"): with a stage of 16 devices, no help. Each replica now says in the run's store
that it reached the round's AllReduce (`worker.StoreArrivals`), and a timeout names those that did
not. Tier 2: three gloo ranks of one data-parallel stage of tiny-mlp with the real executor and a
real TCPStore; rank 2 (device c) joins the groups and then never trains, deterministically."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hppctl.runtime.bootstrap import DistComm, Groups
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.data import SampleOrder, load_data
from hppctl.runtime.executor import Executor
from hppctl.runtime.stage import Stage
from hppctl.runtime.topology import Topology
from hppctl.runtime.worker import DataFeed, StoreArrivals, make_optimizer
from hppctl.schedule import schedule_for_plan
from tests.hostile_peers import free_port
from tests.ranks import start_ranks
from tests.runtime.factories import make_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(120)]

DEVICES = ["a", "b", "c"]
TIMEOUT_S = 3


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, len(DEVICES), is_master=rank == 0, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=len(DEVICES),
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    plan = make_plan("tiny-mlp", [((0, 5), DEVICES, [4, 4, 4])], global_batch=12, micro_batch=12)
    schedule = schedule_for_plan(plan)
    topo, device = Topology.of(schedule), DEVICES[rank]
    stage_group = dist.new_group(list(range(len(DEVICES))), backend="gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    if device == "c":  # joined every group, then silent: never reaches round 0's AllReduce
        return leave_together(store, rank)
    options = TrainOptions(rounds=1, dataset="synthetic", lr=0.1)
    stage = Stage("tiny-mlp", "fine", 0, 5, seed=0)
    data = load_data(options.dataset, "tiny-mlp")
    feed = DataFeed(data, SampleOrder(len(data.train), topo.global_batch, topo.micro_batch, options.seed))
    executor = Executor(device, schedule.actions[device], topo, stage, make_optimizer(stage.parameters(), options),
                        DistComm({d: topo.rank(d) for d in topo.devices}, Groups(rank, topo.world_size, stage_group)),
                        feed)
    executor.arrivals = StoreArrivals(store, device)
    try:
        executor.run_round(0)
        message = "trained round 0"
    except Exception as e:  # noqa: BLE001 - the probe reports what the wait raised
        message = str(e)
    Path(out, f"{device}.txt").write_text(message)
    store.add("reported", 1)
    leave_together(store, rank)


def leave_together(store, rank: int) -> None:
    """No rank leaves (closing its gloo connections) before a and b have their messages: a peer gone
    would fail the other's wait with "Connection closed" instead of its own timeout. Rank 0 holds the
    store, so it leaves last (it ended c's polling once: "Failed to recv, got 0 bytes")."""
    wait_until(store, "reported", 2)
    if rank == 0:
        wait_until(store, "left", len(DEVICES) - 1)
    else:
        store.add("left", 1)


def wait_until(store, counter: str, value: int) -> None:
    deadline = time.monotonic() + 60
    while store.add(counter, 0) < value and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_replica_that_never_reached_the_allreduce_is_named(tmp_path):
    start_ranks(_rank, (free_port(), str(tmp_path)), len(DEVICES))
    for device in ("a", "b"):
        message = (tmp_path / f"{device}.txt").read_text()
        others = ", ".join(d for d in DEVICES if d != device)
        assert f"all-reducing stage 0's gradients with {others} (c never reached it): " in message, message
        assert "Timed out" in message, message
