"""If the coordinator (the `hppctl run` launcher) dies, its workers stop on their own and the
checkpoint directory holds complete rounds only (a real `hppctl run` process killed with SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hppctl.runtime.checkpoint import CheckpointDir
from hppctl.store import save
from tests.recovery.factories import children, preset_profile

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]


def descendants(pid: int) -> list[int]:
    """Every process under `pid`: the workers and, when they fork from it, the launcher's zygote."""
    found, frontier = [], [pid]
    while frontier:
        below = children(frontier.pop())
        found += below
        frontier += below
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_workers_stop_when_the_coordinator_dies_and_the_checkpoint_is_intact(tmp_path, cli):
    profile = preset_profile("tiny-mlp", {"a": "jetson-nano", "b": "jetson-tx2"})
    save(tmp_path / "profile.json", profile)
    (tmp_path / "cluster.yaml").write_text("name: local\ndevices:\n  - {name: a, local: true}\n  - {name: b, local: true}\n")
    assert cli("plan", "--profile", tmp_path / "profile.json", "--global-batch", 16, "--micro-batch", 4,
               "--strategy", "pp", "--out", tmp_path / "plan.yaml")[0] == 0
    ck = tmp_path / "ck"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hppctl", "run", "--plan", str(tmp_path / "plan.yaml"), "--cluster",
         str(tmp_path / "cluster.yaml"), "--profile", str(tmp_path / "profile.json"), "--rounds", "100000",
         "--checkpoint-dir", str(ck), "--heartbeat", "0.5", "--failure-timeout", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not CheckpointDir(ck).complete_rounds() and time.monotonic() < deadline:
            time.sleep(0.2)
        # 2 workers, and the zygote they forked from (hppctl/runtime/zygote.py): nothing may outlive the launcher
        workers = descendants(launcher.pid)
        assert len(workers) == 3 and CheckpointDir(ck).complete_rounds()
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 60
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(w) for w in workers)  # bench/recovery.py measures how soon (< 2x the timeout)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for w in descendants(launcher.pid):
            os.kill(w, signal.SIGKILL)
    rounds = CheckpointDir(ck).complete_rounds()
    newest = ck / f"round-{rounds[-1]:08d}"
    assert sorted(p.name for p in newest.iterdir()) == ["COMPLETE.json", "stage-0.pt", "stage-1.pt"]
