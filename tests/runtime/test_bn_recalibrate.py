"""Precise BatchNorm after training (`--bn-recalibrate`, runtime/results.py: recalibrate_batchnorm)."""

from __future__ import annotations

import json

import pytest
import torch

from hppctl.runtime.data import load_data
from hppctl.runtime.results import build_trained, own_names, recalibrate_batchnorm
from hppctl.store import save
from hppctl.zoo import get_model
from tests.runtime.factories import local_cluster, make_plan


@pytest.fixture(scope="module")
def digits():
    return load_data("digits", "tiny-cnn").train


def trained_state():
    torch.manual_seed(1)
    model = get_model("tiny-cnn").build(seed=3)
    with torch.no_grad():  # running statistics far from any data's, as after a short training
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.fill_(5.0)
            elif name.endswith("running_var"):
                b.fill_(0.01)
    return model.state_dict()


def per_batch_statistics(state, split, indices, batch_size):
    """The stem BatchNorm's input statistics of each micro-batch, taken with a hook in eval mode
    (the layers before it have no BatchNorm, so eval and training mode give the same input)."""
    module = build_trained("tiny-cnn", state)
    stem_bn = next(m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d))
    seen = []
    stem_bn.register_forward_hook(lambda m, args, out: seen.append(args[0].detach()))
    with torch.no_grad():
        for first in range(0, len(indices), batch_size):
            module(split.take(indices[first:first + batch_size])[0])
    means = torch.stack([x.mean(dim=(0, 2, 3)) for x in seen])
    variances = torch.stack([x.transpose(0, 1).reshape(x.shape[1], -1).var(dim=1, unbiased=True) for x in seen])
    return means.mean(dim=0), variances.mean(dim=0)


def test_running_statistics_become_the_average_over_every_micro_batch(digits):
    state = trained_state()
    indices = torch.arange(64)
    new = recalibrate_batchnorm("tiny-cnn", state, digits, indices, 16)
    mean, var = per_batch_statistics(state, digits, indices, 16)
    stem = next(k.removesuffix(".running_mean") for k in new if k.endswith("running_mean"))
    torch.testing.assert_close(new[f"{stem}.running_mean"], mean)
    torch.testing.assert_close(new[f"{stem}.running_var"], var)
    assert int(new[f"{stem}.num_batches_tracked"]) == 4
    # the weights are untouched
    for k, v in state.items():
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(new[k], v), k


def test_a_last_piece_of_one_sample_is_left_out(digits):
    state = trained_state()
    a = recalibrate_batchnorm("tiny-cnn", state, digits, torch.arange(32), 16)
    b = recalibrate_batchnorm("tiny-cnn", state, digits, torch.arange(33), 16)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_model_without_batchnorm_is_left_alone():
    state = get_model("tiny-mlp").build(seed=0).state_dict()
    assert recalibrate_batchnorm("tiny-mlp", state, load_data("digits", "tiny-mlp").train, torch.arange(32), 16) is None


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_hppctl_run_saves_and_tests_the_recalibrated_model(cli, tmp_path):
    from tests.runtime.reference import train_sharded_reference
    from hppctl.runtime.config import TrainOptions
    from hppctl.runtime.data import SampleOrder
    from hppctl.runtime.results import accuracy

    plan = make_plan("tiny-cnn", [((0, 5), ["a", "b"], [3, 1]), ((5, 11), ["c"], [4])], global_batch=16, micro_batch=4)
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b", "c"))
    code, out, err = cli("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml", "--rounds", "3",
                         "--dataset", "digits", "--optimizer", "sgd", "--lr", "0.1", "--threads", "1", "--bn-recalibrate", "40",
                         "--save-model", tmp_path / "model.pt", "--json")
    assert code == 0, err
    summary = json.loads(out)
    data = load_data("digits", "tiny-cnn")
    trained = train_sharded_reference(plan, TrainOptions(rounds=3, dataset="digits", lr=0.1))
    indices = SampleOrder(len(data.train), 16, 4, 0).permutation(0)[:40]
    expected = recalibrate_batchnorm("tiny-cnn", trained, data.train, indices, 4)
    saved = torch.load(tmp_path / "model.pt")
    assert sorted(saved) == sorted(own_names(expected))
    for k, v in own_names(expected).items():
        torch.testing.assert_close(saved[k], v, rtol=1e-4, atol=1e-6, msg=lambda m: f"{k}: {m}")
    assert summary["bn_recalibration"]["samples"] == 40
    assert summary["bn_recalibration"]["test_accuracy_running_averages"] == pytest.approx(
        accuracy("tiny-cnn", trained, data.test), abs=1 / len(data.test))
    assert summary["test_accuracy"] == pytest.approx(accuracy("tiny-cnn", expected, data.test), abs=1 / len(data.test))


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_hppctl_run_says_when_there_is_no_batchnorm_to_recalibrate(cli, tmp_path):
    plan = make_plan("tiny-mlp", [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])], global_batch=16, micro_batch=4)
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    code, out, err = cli("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml", "--rounds", "1",
                         "--dataset", "digits", "--threads", "1", "--bn-recalibrate", "64", "--json")
    assert code == 0, err
    assert json.loads(out)["bn_recalibration"] is None
    assert "--bn-recalibrate: tiny-mlp has no BatchNorm layer" in err
