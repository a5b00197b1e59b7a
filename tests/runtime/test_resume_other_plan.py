"""Tier 2 (gloo): `--resume` on another plan of the same model re-cuts the checkpoint to the new stages.

A run trains a few rounds on one plan and checkpoints; `--resume` with a plan of other cut points,
another device count and a replicated stage must continue from that round and end with the
parameters of one uninterrupted run (Adam: per-parameter step and moments must follow each
parameter to its new stage). A plan of another global batch is refused, naming both plans.
"""

from __future__ import annotations

import json

import pytest
import torch

from hppctl.store import save
from tests.runtime.factories import local_cluster, make_plan

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

FIRST, TOTAL = 3, 6
TWO_STAGES = [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])]
THREE_STAGES = [((0, 1), ["a", "c"], [3, 1]), ((1, 3), ["b"], [4]), ((3, 5), ["c"], [4])]


def run(cli, tmp_path, plan_name: str, rounds: int, *extra):
    return cli("run", "--plan", tmp_path / plan_name, "--cluster", tmp_path / "cluster.yaml", "--rounds", rounds,
               "--optimizer", "adam", "--lr", "0.01", "--threads", "1", *extra)


def test_a_checkpoint_continues_on_a_plan_with_other_stages(cli, tmp_path):
    save(tmp_path / "two.yaml", make_plan("tiny-mlp", TWO_STAGES, global_batch=16, micro_batch=4))
    save(tmp_path / "three.yaml", make_plan("tiny-mlp", [((0, 1), ["a", "c"], [3, 1]), ((1, 3), ["b"], [4]),
                                                          ((3, 5), ["d"], [4])], global_batch=16, micro_batch=4))
    save(tmp_path / "cluster.yaml", local_cluster("a", "b", "c", "d"))
    code, _, err = run(cli, tmp_path, "two.yaml", TOTAL, "--save-model", tmp_path / "whole.pt")
    assert code == 0, err

    checkpoints = ["--checkpoint-dir", tmp_path / "ck"]
    code, _, err = run(cli, tmp_path, "two.yaml", FIRST, *checkpoints)
    assert code == 0, err
    code, out, err = run(cli, tmp_path, "three.yaml", TOTAL, *checkpoints, "--resume", "--json",
                         "--save-model", tmp_path / "recut.pt")
    assert code == 0, err
    assert "re-cut to" in err
    assert json.loads(out)["start_round"] == FIRST
    whole, recut = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "recut.pt")
    assert sorted(recut) == sorted(whole)
    for name in whole:
        torch.testing.assert_close(recut[name], whole[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_a_plan_of_another_global_batch_is_refused_naming_both_plans(cli, tmp_path):
    save(tmp_path / "two.yaml", make_plan("tiny-mlp", TWO_STAGES, global_batch=16, micro_batch=4))
    save(tmp_path / "big.yaml", make_plan("tiny-mlp", TWO_STAGES, global_batch=32, micro_batch=4))
    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    checkpoints = ["--checkpoint-dir", tmp_path / "ck"]
    assert run(cli, tmp_path, "two.yaml", 1, *checkpoints)[0] == 0
    code, out, err = run(cli, tmp_path, "big.yaml", 2, *checkpoints, "--resume")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "its global_batch is 16 where this run's is 32" in err and "[0, 2) a | [2, 5) b" in err
