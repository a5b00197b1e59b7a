"""Cron: a run killed in the middle and started again with `--resume` ends where an uninterrupted run ends.

The interrupted run is a real `hppctl run` process killed with SIGKILL once a few rounds are
checkpointed (its workers follow it: they get SIGTERM when the launcher dies); the second start
takes the released lock, continues from the newest complete round, and its saved model must equal
the uninterrupted run's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from hppctl.runtime.checkpoint import CheckpointDir
from hppctl.store import save
from tests.runtime.factories import local_cluster, make_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(600)]

ROUNDS = 24


def test_killed_and_resumed_equals_uninterrupted(cli, tmp_path):
    plan = make_plan("tiny-mlp", [((0, 2), ["a", "b"], [3, 1]), ((2, 5), ["c"], [4])], global_batch=16, micro_batch=4)
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b", "c"))
    common = ["run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml", "--rounds", str(ROUNDS),
              "--dataset", "tests.runtime.userdata:slow_features", "--optimizer", "adam", "--lr", "0.01", "--threads", "1"]

    code, _, err = cli(*common, "--save-model", tmp_path / "whole.pt")
    assert code == 0, err

    ck = CheckpointDir(tmp_path / "ck")
    killed = subprocess.Popen([sys.executable, "-m", "hppctl", *map(str, common), "--checkpoint-dir", str(ck.path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ck.complete_rounds() or ck.complete_rounds()[-1] < 5:
        assert killed.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    reached = ck.complete_rounds()[-1]
    assert reached < ROUNDS

    code, out, err = cli(*common, "--checkpoint-dir", ck.path, "--resume", "--save-model", tmp_path / "resumed.pt", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["start_round"] >= reached and summary["rounds_run"] == ROUNDS - summary["start_round"]
    whole, resumed = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "resumed.pt")
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=1e-4, atol=1e-6)
