"""Issue 27's acceptance on a real 2-host edge lab (needs root): a user's own module, written only for
this test (a small CNN with a residual branch, and a feature MLP), lives in a file of a `--workdir`;
it is profiled on the lab's hosts (the probes import it from the shipped workdir), planned with
`asteroid`, trained with `hppctl run` on a folder of PNG images, an `.npz` file and a CSV, and saved
with `--save-model`. Each run ends with the parameters of a one-device `dp` run of the same module,
seed, data and optimizer (`assert_close`), and the saved file loads into the plain module in a
Python where hppctl cannot be imported. Every command runs from a directory that is NOT the
workdir, so the module is found only through `--workdir`. No wall-clock assertions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.runtime.datasets_files import features, image_folder, write_csv

pytestmark = [pytest.mark.lab, pytest.mark.gloo, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
NAME = "pytest-userwl"
SPEC = f"""\
name: {NAME}
bandwidth: 100mbit
subnet: {{subnet}}
hosts:
  - {{name: ua, cpu: 0.5, memory: 1GB}}
  - {{name: ub, cpu: 0.5, memory: 1GB}}
"""

NET = '''
import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + x)


class ResidualCnn(nn.Module):
    """3x8x8 images, 3 classes; no BatchNorm, no dropout."""

    input_shape = (3, 8, 8)

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU())
        self.block = Residual(6)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.block(self.stem(x))), 1))


class FeatureMlp(nn.Module):
    """12 features, 3 classes."""

    input_shape = (12,)

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Sequential(nn.Linear(12, 32), nn.ReLU())
        self.fc2 = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
        self.out = nn.Linear(32, 3)

    def forward(self, x):
        return self.out(self.fc2(self.fc1(x)))


def cnn():
    return ResidualCnn()


def mlp():
    return FeatureMlp()
'''

ONE_PRESET = "name: one\ndevices:\n  - {name: solo, preset: rpi4}\n"
ONE_LOCAL = "name: one\ndevices:\n  - {name: solo, local: true}\n"
TRAINING = ["--rounds", "4", "--seed", "3", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
            "--threads", "1"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The lab's cluster file, with each host's `python:` running this checkout's hppctl."""
    from tests.lab.conftest import built_lab, checkout_cluster

    with built_lab(tmp_path_factory, NAME, SPEC) as built:
        cluster = checkout_cluster(built)
        yield cluster


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """(workdir holding the module, a separate directory the commands run in, its data files)."""
    root = tmp_path_factory.mktemp("userwl")
    workdir, elsewhere = root / "code", root / "run"
    workdir.mkdir()
    elsewhere.mkdir()
    module = f"usernet_{uuid.uuid4().hex[:8]}"  # a digest and a module name no earlier run cached
    (workdir / f"{module}.py").write_text(NET)
    images = image_folder(root / "images", per_class=16)
    x, y = features(n=72, dims=12, classes=3, seed=1)
    csv = write_csv(root / "features.csv", x, y)
    gen = torch.Generator().manual_seed(5)
    labels = torch.arange(60) % 3
    pictures = torch.randn(60, 3, 8, 8, generator=gen) * 0.5 + labels.view(-1, 1, 1, 1).float() - 1
    npz = root / "images.npz"
    np.savez(npz, x=pictures.numpy().astype(np.float32), y=labels.numpy().astype(np.int64))
    return workdir, elsewhere, module, {"images": images, "npz": npz, "csv": csv}


def hppctl(*argv, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hppctl", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=cwd)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def lab_profile_and_plan(lab, work, factory: str, tag: str) -> Path:
    """`hppctl profile` measured on the lab's two hosts (the probes import the module from the shipped
    workdir), then `hppctl plan --strategy asteroid`; the plan's path."""
    workdir, here, module, _ = work
    model = f"{module}:{factory}"
    profiled = ok(hppctl("profile", "--cluster", lab, "--model", model, "--workdir", workdir, "--batch-sizes", "4",
                         "--repeats", "1", "--warmup", "0", "--no-links", "--out", f"{tag}-profile.json", "--json",
                         cwd=here))
    summary = json.loads(profiled.stdout)
    assert summary["model"] == model and {d["name"] for d in summary["devices"]} == {"ua", "ub"}
    assert all(d["source"] == "measured" for d in summary["devices"]), summary["devices"]
    ok(hppctl("plan", "--profile", f"{tag}-profile.json", "--strategy", "asteroid", "--global-batch", "16",
              "--micro-batch", "4", "--out", f"{tag}-plan.yaml", cwd=here))
    return here / f"{tag}-plan.yaml"


def one_device_plan(work, factory: str, tag: str) -> Path:
    """The reference's plan: `dp` on one device (a preset profile of the same module)."""
    workdir, here, module, _ = work
    (here / "one.yaml").write_text(ONE_PRESET)
    (here / "one-local.yaml").write_text(ONE_LOCAL)
    ok(hppctl("profile", "--cluster", "one.yaml", "--model", f"{module}:{factory}", "--workdir", workdir,
              "--batch-sizes", "4", "--out", f"{tag}-one.json", cwd=here))
    ok(hppctl("plan", "--profile", f"{tag}-one.json", "--strategy", "dp", "--global-batch", "16", "--micro-batch", "4",
              "--out", f"{tag}-dp.yaml", cwd=here))
    return here / f"{tag}-dp.yaml"


def train(plan: Path, cluster: Path, dataset, saved: str, work, *extra) -> dict:
    workdir, here, _, _ = work
    done = ok(hppctl("run", "--plan", plan, "--cluster", cluster, "--dataset", dataset, *extra, *TRAINING,
                     "--workdir", workdir, "--save-model", saved, "--json", cwd=here))
    return json.loads(done.stdout)


def assert_same_parameters(work, a: str, b: str) -> None:
    _, here, _, _ = work
    mine, reference = torch.load(here / a), torch.load(here / b)
    assert sorted(mine) == sorted(reference)
    for key in reference:
        torch.testing.assert_close(mine[key], reference[key], rtol=1e-4, atol=1e-6, msg=lambda m: f"{key}: {m}")


def assert_loads_without_hppctl(work, saved: str, cls: str) -> None:
    """The saved file is the module's own state dict: a plain Python (hppctl not importable) loads it."""
    workdir, here, module, _ = work
    script = ("import sys; sys.modules['hppctl'] = None\n"
              "import torch\n"
              f"import {module} as user\n"
              f"net = user.{cls}()\n"
              f"state = torch.load({str(here / saved)!r})\n"
              "net.load_state_dict(state)\n"
              "try:\n    import hppctl\nexcept ImportError:\n    print('loaded without hppctl', len(state))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=workdir, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("loaded without hppctl")


def test_a_user_cnn_from_a_workdir_profiled_planned_and_trained_on_the_lab_from_images_and_npz(lab, work):
    plan = lab_profile_and_plan(lab, work, "cnn", "cnn")
    reference_plan = one_device_plan(work, "cnn", "cnn")
    data = work[3]

    on_lab = train(plan, lab, data["images"], "lab-images.pt", work)
    assert set(on_lab["workdir"]["sent_bytes"]) == {"ua", "ub"}
    assert on_lab["workdir"]["sent_total_bytes"] == 0  # `hppctl profile` installed this content already
    train(reference_plan, work[1] / "one-local.yaml", data["images"], "one-images.pt", work)
    assert_same_parameters(work, "lab-images.pt", "one-images.pt")
    assert_loads_without_hppctl(work, "lab-images.pt", "ResidualCnn")

    train(plan, lab, data["npz"], "lab-npz.pt", work)
    train(reference_plan, work[1] / "one-local.yaml", data["npz"], "one-npz.pt", work)
    assert_same_parameters(work, "lab-npz.pt", "one-npz.pt")


def test_a_user_feature_model_from_a_workdir_trained_on_the_lab_from_a_csv(lab, work):
    plan = lab_profile_and_plan(lab, work, "mlp", "mlp")
    reference_plan = one_device_plan(work, "mlp", "mlp")
    csv = work[3]["csv"]
    train(plan, lab, csv, "lab-csv.pt", work, "--label-column", "label")
    train(reference_plan, work[1] / "one-local.yaml", csv, "one-csv.pt", work, "--label-column", "label")
    assert_same_parameters(work, "lab-csv.pt", "one-csv.pt")
    assert_loads_without_hppctl(work, "lab-csv.pt", "FeatureMlp")
