"""Tier 2 (gloo): `--resume` on another plan of the same model re-cuts the checkpoint to the new stages.

A run trains a few rounds on one plan and checkpoints; `--resume` with a plan of other cut points,
another device count and a replicated stage must continue from that round and end with the
parameters of the single-process loop over all rounds (Adam: per-parameter step and moments must
follow each parameter to its new stage). A plan of another global batch is refused before any
worker starts, naming both plans.
"""

from __future__ import annotations

import json

import pytest
import torch

from hppctl.runtime.checkpoint import CheckpointDir
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.results import own_names
from hppctl.runtime.session import plan_document
from hppctl.store import save
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.reference import train_reference
from tests.runtime.test_equivalence import assert_same

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

FIRST, TOTAL = 3, 6
TWO = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])], global_batch=16, micro_batch=4)
THREE = make_plan("tiny-mlp", [((0, 1), ["a", "c"], [3, 1]), ((1, 3), ["b"], [4]), ((3, 5), ["d"], [4])],
                  global_batch=16, micro_batch=4)


def run(cli, tmp_path, plan_name: str, rounds: int, *extra):
    return cli("run", "--plan", tmp_path / plan_name, "--cluster", tmp_path / "cluster.yaml", "--rounds", rounds,
               "--optimizer", "adam", "--lr", "0.01", "--threads", "1", "--checkpoint-dir", tmp_path / "ck", *extra)


def test_a_checkpoint_continues_on_a_plan_with_other_stages(cli, tmp_path):
    save(tmp_path / "two.yaml", TWO)
    save(tmp_path / "three.yaml", THREE)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b", "c", "d"))
    code, _, err = run(cli, tmp_path, "two.yaml", FIRST)
    assert code == 0, err
    code, out, err = run(cli, tmp_path, "three.yaml", TOTAL, "--resume", "--json", "--save-model", tmp_path / "recut.pt")
    assert code == 0, err
    assert "re-cut to" in err
    assert json.loads(out)["start_round"] == FIRST
    whole = train_reference(TWO, TrainOptions(rounds=TOTAL, optimizer="adam", lr=0.01, dataset="synthetic"))
    assert_same(torch.load(tmp_path / "recut.pt"), own_names(whole))  # the saved model has the model's own names


def test_a_plan_of_another_global_batch_is_refused_naming_both_plans(cli, tmp_path):
    save(tmp_path / "big.yaml", make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])],
                                          global_batch=32, micro_batch=4))
    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    # a round written by TWO (the stage files are never read: the refusal comes first)
    CheckpointDir(tmp_path / "ck").write_round(1, {0: b"", 1: b""}, {"plan": plan_document(TWO)})
    code, out, err = run(cli, tmp_path, "big.yaml", 2, "--resume")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "its global_batch is 16 where this run's is 32" in err and "[0, 2) a | [2, 5) b" in err
