"""When a fault-tolerant run ends, no worker outlives it: not even one that left and is still
handing its layers over, or one frozen while it did (`FtSession._stop_all`)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from hppctl.runtime.config import TrainOptions
from hppctl.runtime.launch import LocalWorker
from hppctl.runtime.ft_session import RecoveryOptions, FtSession
from hppctl.runtime.session import RunRequest
from tests.recovery.factories import preset_profile
from tests.runtime.factories import local_cluster, make_plan

pytestmark = pytest.mark.timeout(120)

REPO = str(Path(__file__).parents[2])


def sleeper(device: str) -> LocalWorker:
    """A real local process that lives until it is signalled (tests/runtime/echo_worker.py)."""
    return LocalWorker(device, json.dumps({"sleep": 600}), env={"PYTHONPATH": REPO}, module="tests.runtime.echo_worker")


@pytest.mark.parametrize("frozen", [False, True], ids=["handing-over", "frozen-while-handing-over"])
def test_a_device_that_left_and_still_runs_is_ended_with_the_run(frozen):
    plan = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])], global_batch=16, micro_batch=4)
    session = FtSession(RunRequest(plan, local_cluster("a", "b"), TrainOptions()),
                               RecoveryOptions(profile=preset_profile("tiny-mlp", {"a": "jetson-nano", "b": "jetson-nano"})))
    session.workers = {"a": sleeper("a"), "b": sleeper("b")}
    session.lost = ["b"]  # b left: lost to the plan, but not fenced, as it hands its layers over
    if frozen:
        os.kill(session.workers["b"].proc.pid, signal.SIGSTOP)
    session._stop_all()
    for device, worker in session.workers.items():
        # before: b was skipped as lost and kept running (a frozen one for good)
        assert worker.proc.wait(timeout=30) is not None, device
