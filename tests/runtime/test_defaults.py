"""Defaults that learn (issue 25 item 3): with no optimizer flag, `hppctl run` (rounds and nf1b) and
`hppctl psl run` train; the default is chosen per model family, printed and recorded; `--resume`
of a checkpoint written under another default keeps the recorded optimizer.

The old default (SGD, lr 0.05, momentum 0.9) on the same runs, measured on the 2-core development
machine: vgg-mini 7.0 % test accuracy after 2 epochs (rounds and nf1b alike; the new default 78.0 %
and 76.6 %), examples/psl.yaml 36.5 % after 20 rounds of 5 local batches (the new 61.3 %)."""

from __future__ import annotations

import json

import pytest

from hppctl.runtime.optimizer_defaults import CNN, TINY, TRANSFORMER, family_default, resolve
from hppctl.planner.manual import manual_plan
from hppctl.store import save
from tests.runtime.factories import local_cluster


@pytest.fixture
def vgg_files(tmp_path):
    """vgg-mini on two local workers, one stage each (as nf1b needs), micro-batches of 16."""
    plan = manual_plan("vgg-mini", [((0, 10), ["a"], [16]), ((10, 21), ["b"], [16])], global_batch=64, micro_batch=16)
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    return ["--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml"]


# --- pure: which default, printed --------------------------------------------------------------------

@pytest.mark.parametrize("model, expected", [("tiny-mlp", TINY), ("tiny-cnn", TINY), ("vgg-mini", CNN),
                                             ("mobilenetv2", CNN), ("resnet50", CNN), ("tiny-bert", TRANSFORMER),
                                             ("bert-small", TRANSFORMER)])
def test_every_builtin_training_model_has_a_family_default(model, expected):
    assert family_default(model) == expected


def test_the_default_is_printed_with_its_family_and_how_to_change_it():
    chosen = resolve("vgg-mini")
    assert chosen.line() == f"optimizer: adam lr {CNN.lr:g} (default for CNNs; --optimizer/--lr to change)"
    # optimizer and rate given: nothing to say (momentum, weight decay and warm-up default alike for all)
    assert resolve("vgg-mini", optimizer="adam", lr=0.002, lr_schedule="cosine").line() is None


def test_sgd_without_lr_gets_sgds_own_rate_not_the_adam_default():
    chosen = resolve("vgg-mini", optimizer="sgd")
    assert (chosen.optimizer, chosen.lr, chosen.momentum) == ("sgd", 0.05, 0.9)
    assert resolve("vgg-mini", lr=0.01).optimizer == "adam"


def test_a_recorded_checkpoint_wins_over_the_family_default():
    meta = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0,
            "lr_schedule": "cosine, 44 rounds, 4 warm-up rounds",
            "_file": "ck/round-00000044/COMPLETE.json"}
    chosen = resolve("vgg-mini", recorded=meta)
    assert chosen.as_options() == {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0,
                                   "lr_schedule": "cosine", "warmup_rounds": 4}
    assert "as recorded in ck/round-00000044/COMPLETE.json" in chosen.line()


# --- gloo: the defaults learn -------------------------------------------------------------------------

@pytest.mark.gloo
@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule", [[], ["--schedule", "nf1b"]], ids=["rounds", "nf1b"])
def test_run_without_optimizer_flags_learns_vgg_mini(cli, vgg_files, schedule):
    code, out, err = cli("run", *vgg_files, "--dataset", "digits", "--epochs", "2", "--threads", "1", "--json", *schedule)
    assert code == 0, err
    summary = json.loads(out)
    assert f"optimizer: adam lr {CNN.lr:g} (default for CNNs" in err
    assert summary["optimizer"]["optimizer"] == "adam" and summary["optimizer"]["source"] == "default for CNNs"
    # the old default (sgd 0.05) stayed at 7.0 % (chance) on both; the new one reached 78.0 / 76.6 %
    assert summary["test_accuracy"] > 0.5


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_psl_run_without_optimizer_flags_learns(cli, tmp_path):
    code, _, err = cli("psl", "plan", "--spec", "examples/psl.yaml", "--out", tmp_path / "psl.yaml")
    assert code == 0, err
    code, out, err = cli("psl", "run", "--plan", tmp_path / "psl.yaml", "--cluster", "examples/psl-cluster.yaml",
                         "--dataset", "digits", "--rounds", "20", "--local-batches", "5", "--threads", "1", "--json")
    assert code == 0, err
    assert f"optimizer: adam lr {TINY.lr:g} (default for the tiny test models" in err
    summary = json.loads(out)
    assert summary["optimizer"]["source"] == "default for the tiny test models"
    # the old default: 36.5 %; the new: 61.3 %
    assert summary["test_accuracy"] > 0.5


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_resume_of_a_checkpoint_written_with_the_old_default_keeps_its_optimizer(cli, tmp_path):
    plan = manual_plan("tiny-mlp", [((0, 2), ["a"], [8]), ((2, 5), ["b"], [8])], global_batch=16, micro_batch=8)
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    base = ["run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml", "--threads", "1",
            "--checkpoint-dir", tmp_path / "ck"]
    # what every run recorded before the per-family defaults: sgd 0.05, momentum 0.9
    code, _, err = cli(*base, "--rounds", "2", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9")
    assert code == 0, err
    # act: resume with no optimizer flag
    code, out, err = cli(*base, "--rounds", "4", "--resume", "--json")
    # assert: it continues as it was trained, and says so
    assert code == 0, err
    assert "optimizer: sgd lr 0.05 momentum 0.9 (as recorded in" in err
    summary = json.loads(out)
    assert summary["start_round"] == 2
    assert (summary["optimizer"]["optimizer"], summary["optimizer"]["lr"]) == ("sgd", 0.05)
    # another optimizer given on the command line is still refused (the checkpoint's is sgd)
    code, _, err = cli(*base, "--rounds", "6", "--resume", "--optimizer", "adam")
    assert code == 2 and "optimizer is 'sgd', this run has 'adam'" in err
