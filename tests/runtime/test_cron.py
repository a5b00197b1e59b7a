"""Cron: a run killed in the middle and started again with `--resume` ends where an uninterrupted run ends.

The interrupted run is a real `hppctl run` process killed with SIGKILL once a few rounds are
checkpointed (its workers follow it: they get SIGTERM when the launcher dies); the second start
takes the released lock, continues from the newest complete round, and its saved model must equal
the uninterrupted run's (the single-process loop, which `hppctl run` equals). Under a warm-up and
cosine schedule, so the resumed rounds must also take the rates the uninterrupted run gave them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from hppctl.runtime.checkpoint import CheckpointDir
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.results import own_names
from hppctl.store import save
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.reference import train_reference
from tests.runtime.test_equivalence import assert_same

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(600)]

ROUNDS = 24
DATASET = "tests.runtime.userdata:slow_features"


def test_killed_and_resumed_equals_uninterrupted(cli, tmp_path):
    plan = make_plan("tiny-mlp", [((0, 2), ["a", "b"], [3, 1]), ((2, 5), ["c"], [4])], global_batch=16, micro_batch=4)
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b", "c"))
    common = ["run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml", "--rounds", str(ROUNDS),
              "--dataset", DATASET, "--optimizer", "adam", "--lr", "0.01", "--lr-schedule", "cosine",
              "--warmup-rounds", "3", "--threads", "1"]

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
    # the uninterrupted run: `hppctl run` equals the single-process loop (tests/runtime/test_equivalence.py).
    # rtol 1e-3: Adam turns a near-zero gradient into a full step of its sign, so the replicated
    # stage's different summation order moves one weight of 4096 by 2e-4 relative over these 24
    # rounds — an uninterrupted `hppctl run` differs from the loop by the same amount there.
    assert_same(torch.load(tmp_path / "resumed.pt"), own_names(train_reference(plan, TrainOptions(
        rounds=ROUNDS, dataset=DATASET, optimizer="adam", lr=0.01, lr_schedule="cosine", warmup_rounds=3))),
        rtol=1e-3, atol=1e-5)
