"""A plain run (no fault tolerance) whose device stops answering fails naming that device.

A device whose process hangs, whose host sleeps or whose link goes down sends nothing more; its
pipeline neighbour waits out `--timeout` in gloo and fails. Its error named only itself and gloo's
"Timed out waiting 6000ms for recv operation" (2026-11-27, on a lab whose host's link was cut), so
the user was pointed at the device that was fine. The waiting worker now says whom it waited for:
the sender of a receive, the receiver of a send, the other replicas of an AllReduce.
Tier 2 (gloo, local workers); the stopped worker stands for any silent device."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.runtime.factories import start_endless_two_device_run
from tests.runtime.test_schedule_matrix import local_workers, reported_round, wait_for

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]


def test_a_device_that_stops_answering_is_named_by_the_worker_that_waited_for_it(tmp_path):
    error = error_after_stopping(tmp_path, "a")
    assert error.startswith("error: worker on device b failed (exit 1)"), error
    assert "receiving activations from a:" in error, error


def test_a_replica_that_stops_answering_is_named_by_the_one_left_in_the_allreduce(tmp_path):
    error = error_after_stopping(tmp_path, "b", replicated=True)
    assert error.startswith("error: worker on device a failed (exit 1)"), error
    assert "all-reducing stage 0's gradients with b:" in error, error


def error_after_stopping(where, device: str, *, replicated: bool = False) -> str:
    """SIGSTOP `device`'s worker once round 1 is reported, with `--timeout 6`; the launcher's one
    `error:` line."""
    launcher, metrics = start_endless_two_device_run(where, "--timeout", 6, stderr=subprocess.PIPE,
                                                     replicated=replicated)
    try:
        wait_for(lambda: reported_round(metrics) >= 1, launcher, "round 1")
        workers = dict(zip("ab", local_workers(launcher.pid)))  # started in the plan's order: a, then b
        os.kill(workers[device], signal.SIGSTOP)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]
