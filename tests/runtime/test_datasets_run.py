"""Tier 2 (gloo): each file dataset trains end to end through `hppctl run` on 2 local workers.

The saved model must equal the single-process reference trained on `load_data`'s training split in
the run's `SampleOrder` (tests/runtime/reference.py): the workers read the same files, decode the same
samples and take them in the same seeded order as for the built-in datasets."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hppctl.runtime.config import TrainOptions
from hppctl.runtime.data import load_data
from hppctl.runtime.results import own_names
from hppctl.store import save
from tests.runtime.datasets_files import features, image_folder, write_csv
from tests.runtime.factories import local_cluster, make_plan
from tests.runtime.reference import train_reference, train_sharded_reference

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(300)]

EPOCHS = 2
STAGES = {"tiny-mlp": [((0, 2), ["a"], [4]), ((2, 5), ["b"], [4])],
          "tiny-cnn": [((0, 4), ["a"], [4]), ((4, 11), ["b"], [4])]}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HPPCTL_CACHE_DIR", str(tmp_path / "cache"))  # the workers inherit it
    return tmp_path / "cache"


def train(cli, tmp_path, model: str, dataset: str, *flags: str):
    plan = make_plan(model, STAGES[model], global_batch=8, micro_batch=4)
    save(tmp_path / "plan.yaml", plan)
    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    code, out, err = cli("run", "--plan", tmp_path / "plan.yaml", "--cluster", tmp_path / "cluster.yaml",
                         "--dataset", dataset, *flags, "--epochs", str(EPOCHS), "--optimizer", "sgd", "--lr", "0.05",
                         "--threads", "1", "--save-model", tmp_path / "model.pt", "--json")
    assert code == 0, err
    return plan, json.loads(out), torch.load(tmp_path / "model.pt", weights_only=True)


def assert_reference(plan, summary, saved, dataset: str, reference=train_reference):
    rounds = EPOCHS * (len(load_data(dataset, plan.model).train) // plan.global_batch)
    assert summary["rounds_run"] == rounds and summary["dataset"] == dataset
    assert summary["test_accuracy"] is not None
    options = TrainOptions(dataset=dataset, rounds=rounds, optimizer="sgd", lr=0.05)
    expected = own_names(reference(plan, options))
    assert sorted(saved) == sorted(expected)
    for name in expected:
        torch.testing.assert_close(saved[name], expected[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_folder_of_images(cli, tmp_path, cache_dir):
    root = image_folder(tmp_path / "imgs", per_class=12)  # 36 images, about 7 of them test samples
    plan, summary, saved = train(cli, tmp_path, "tiny-cnn", str(root))
    assert len(list((cache_dir / "datasets").glob("*.pt"))) == 1  # decoded once, then read by every worker
    assert_reference(plan, summary, saved, str(root), reference=train_sharded_reference)


def test_npz(cli, tmp_path):
    x, y = features(n=60)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    plan, summary, saved = train(cli, tmp_path, "tiny-mlp", str(tmp_path / "d.npz"))
    assert_reference(plan, summary, saved, str(tmp_path / "d.npz"))


def test_pt(cli, tmp_path):
    gen = torch.Generator().manual_seed(5)
    torch.save((torch.randn(45, 3, 8, 8, generator=gen), torch.arange(45) % 10), tmp_path / "d.pt")
    plan, summary, saved = train(cli, tmp_path, "tiny-cnn", str(tmp_path / "d.pt"))
    assert_reference(plan, summary, saved, str(tmp_path / "d.pt"), reference=train_sharded_reference)


def test_csv_with_a_label_column_given_by_a_relative_path(cli, tmp_path, monkeypatch):
    x, y = features(n=50)
    write_csv(tmp_path / "d.csv", x, y, label_at=3)
    monkeypatch.chdir(tmp_path)  # the workers start in the launcher's directory and read the same file
    plan, summary, saved = train(cli, tmp_path, "tiny-mlp", "d.csv", "--label-column", "label")
    assert_reference(plan, summary, saved, "d.csv#label=label")
