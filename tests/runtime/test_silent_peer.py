"""A plain run (no fault tolerance) whose device stops answering fails naming that device.

A device whose process hangs, whose host sleeps or whose link goes down sends nothing more; its
pipeline neighbour waits out `--timeout` in gloo and fails. Its error named only itself and gloo's
"Timed out waiting 6000ms for recv operation" (2026-11-27, on a lab whose host's link was cut), so
the user was pointed at the device that was fine. The waiting worker now says whom it waited for.
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
    launcher, metrics = start_endless_two_device_run(tmp_path, "--timeout", 6, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: reported_round(metrics) >= 1, launcher, "round 1")
        first, _ = local_workers(launcher.pid)  # started in the plan's order: a, then b
        os.kill(first, signal.SIGSTOP)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith("error: worker on device b failed (exit 1)"), errors[0]
    assert "receiving activations from a:" in errors[0], errors[0]
