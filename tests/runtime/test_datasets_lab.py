"""File datasets on SSH devices of a real 2-host lab (docs/runtime.md, "Your data", Paths): each
worker reads the dataset's path on its own host. Needs root; about a minute."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hppctl.errors import HppctlError
from hppctl.models.cluster import ClusterSpec
from hppctl.runtime.config import TrainOptions
from hppctl.runtime.session import RunRequest, Session
from hppctl.store import load
from tests.runtime.datasets_files import features, image_folder
from tests.runtime.factories import make_plan
from tests.runtime.reference import train_reference, train_sharded_reference
from tests.runtime.test_equivalence import assert_same

pytestmark = [pytest.mark.lab, pytest.mark.gloo, pytest.mark.timeout(600)]

NAME = "pytest-datasets"
SPEC = f"""\
name: {NAME}
bandwidth: 100mbit
subnet: {{subnet}}
hosts:
  - {{name: da, cpu: 0.5, memory: 1GB}}
  - {{name: db, cpu: 0.5, memory: 1GB}}
"""
REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from tests.lab.conftest import built_lab

    with built_lab(tmp_path_factory, NAME, SPEC) as built:
        yield load(built.cluster_file, ClusterSpec)


def _run(lab, plan, options, tmp_path):
    # the SSH workers run this checkout (PYTHONPATH) and cache under the test's folder, not ~/.cache
    env = {"PYTHONPATH": REPO, "HPPCTL_CACHE_DIR": str(tmp_path / "cache")}
    return Session(RunRequest(plan, lab, options, env=env)).run()


def test_ssh_workers_read_a_folder_of_images_by_its_absolute_path(lab, tmp_path):
    root = image_folder(tmp_path / "imgs", per_class=8)
    plan = make_plan("tiny-cnn", [((0, 4), ["da"], [4]), ((4, 11), ["db"], [4])], global_batch=8, micro_batch=4)
    options = TrainOptions(rounds=3, dataset=str(root), lr=0.05)
    result = _run(lab, plan, options, tmp_path)
    assert_same(result.model_state(), train_sharded_reference(plan, options))
    assert len(list((tmp_path / "cache" / "datasets").glob("*.pt"))) == 1  # decoded on one host, read on the other


def test_a_relative_path_is_read_from_the_ssh_login_directory(lab, tmp_path, monkeypatch):
    x, y = features(n=40)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    monkeypatch.chdir(tmp_path)  # found here, where the launcher runs, but not in the workers' home
    plan = make_plan("tiny-mlp", [((0, 2), ["da"], [4]), ((2, 5), ["db"], [4])], global_batch=8, micro_batch=4)
    options = TrainOptions(rounds=2, dataset="d.npz", lr=0.05)
    train_reference(plan, options)  # the launcher itself reads it
    with pytest.raises(HppctlError) as failed:
        _run(lab, plan, options, tmp_path)
    message = str(failed.value)
    assert "--dataset d.npz: no such file or folder" in message
    assert "worker on device da failed" in message or "worker on device db failed" in message
