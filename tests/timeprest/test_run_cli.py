"""`hppctl run --schedule nf1b|pipedream`: refusals (exit 2) and one short epoch end to end."""

from __future__ import annotations

import json

import pytest

from hppctl.planner.manual import manual_plan
from hppctl.store import save
from tests.runtime.factories import local_cluster


def _files(tmp_path, stages):
    plan = manual_plan("tiny-mlp", stages, global_batch=256, micro_batch=128)
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster(*plan.devices()))
    return tmp_path / "plan.yaml", tmp_path / "cluster.yaml"


def test_replicated_stage_is_refused(cli, tmp_path):
    plan, cluster = _files(tmp_path, [((0, 2), ["a", "b"], [64, 64]), ((2, 5), ["c"], [128])])
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster, "--schedule", "nf1b")
    assert code == 2 and "one device per stage" in err and out == ""


def test_unknown_schedule_and_rounds_are_refused(cli, tmp_path):
    plan, cluster = _files(tmp_path, [((0, 2), ["a"], [128]), ((2, 5), ["b"], [128])])
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--schedule", "gpipe")
    assert code == 2 and "not an asynchronous schedule" in err
    code, _, err = cli("run", "--plan", plan, "--cluster", cluster, "--schedule", "nf1b", "--rounds", "3")
    assert code == 2 and "use --epochs" in err


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_one_epoch_of_nf1b(cli, tmp_path):
    plan, cluster = _files(tmp_path, [((0, 2), ["a"], [128]), ((2, 5), ["b"], [128])])
    code, out, err = cli("run", "--plan", plan, "--cluster", cluster, "--schedule", "nf1b", "--epochs", "1",
                         "--dataset", "digits", "--json", "--checkpoint-dir", tmp_path / "ckpt")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["rounds_run"] == 1 and summary["test_accuracy"] is not None
    assert (tmp_path / "ckpt" / "round-00000001" / "stage-1.pt").exists()
