"""A PSL helper whose client stops answering names that client (as the training executor does:
tests/runtime/test_silent_peer.py). With `--order ltf` the helper waits for its inputs in one
thread per task; a failed wait there was printed as that thread's traceback, and the helper said
only "no input reached the helper within N s" once its own (longer) wait ran out. Tier 2: two
real gloo processes on loopback (tests/psl/arrivals_probe.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile_peers import free_port

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def test_a_failed_wait_for_a_clients_input_names_the_client_and_prints_no_thread_traceback():
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-m", "tests.psl.arrivals_probe", str(rank), str(port)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        out, err = ranks[0].communicate(timeout=60)
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
            process.wait()
    assert out.startswith("raised RuntimeError: receiving activations from c0: "), out + err
    assert "Timed out" in out, out
    assert "Traceback" not in err and "Exception in thread" not in err, err
