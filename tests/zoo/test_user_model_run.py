"""Tier 2 (gloo): a user module, written for the test in a temporary directory, through the commands a
user runs: `hppctl profile` on three local workers, `hppctl plan --strategy asteroid` (three stages),
`hppctl run` on them; its final parameters equal a one-device `dp` run of the same module (same seed,
data and optimizer), and `--save-model` writes the module's own names, loadable without hppctl."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hppctl.models.plan import HppPlan
from hppctl.models.profile import ModelInput, Profile
from hppctl.store import load
from hppctl.zoo.user import import_factory
from tests.zoo.usermodule import RESNET, write_module

pytestmark = [pytest.mark.gloo, pytest.mark.timeout(600)]

THREE_LOCAL = "name: local\ndevices:\n" + "".join(f"  - {{name: w{i}, local: true}}\n" for i in range(3))
THREE_BUDGETED = "name: budgeted\ndevices:\n" + "".join(f"  - {{name: w{i}, preset: rpi4, memory: 1MB}}\n"
                                                         for i in range(3))
"""The same three device names, modelled, with a budget of 1 MB each: WideHead's three parts need ~0.6 MB
each (weights, gradients, momentum, in-flight activations), two never fit one device, so asteroid's
only plan is three single-device stages. (A plan from the measured profile takes whatever shape the
times of this shared machine favour: 2+1, 1+1 and 1+1+1 in three consecutive profiles.)"""
ONE_PRESET = "name: one\ndevices:\n  - {name: w0, preset: rpi4}\n"
ONE_LOCAL = "name: one\ndevices:\n  - {name: w0, local: true}\n"
TRAINING = ["--rounds", "5", "--seed", "3", "--dataset", "synthetic", "--optimizer", "sgd", "--lr", "0.05",
            "--momentum", "0.9", "--threads", "1"]


def test_a_user_module_trains_under_a_three_stage_plan_as_on_one_device(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = write_module(tmp_path, RESNET)
    model = f"{name}:make_wide"
    for file, text in (("local.yaml", THREE_LOCAL), ("budgeted.yaml", THREE_BUDGETED), ("one.yaml", ONE_PRESET),
                       ("one-local.yaml", ONE_LOCAL)):
        (tmp_path / file).write_text(text)

    # measured on the three local workers: the probe builds and times the user's module in each
    code, _, err = cli("profile", "--cluster", "local.yaml", "--model", model, "--batch-sizes", "4", "--repeats", "1",
                       "--warmup", "1", "--no-links", "--out", "measured.json")
    assert code == 0, err
    measured = load(tmp_path / "measured.json", Profile)
    assert measured.source == "measured" and measured.model_input == ModelInput(shape=[3, 8, 8])
    code, _, err = cli("plan", "--profile", "measured.json", "--strategy", "asteroid", "--global-batch", "16",
                       "--micro-batch", "4", "--out", "measured-plan.yaml")
    assert code == 0, err
    assert load(tmp_path / "measured-plan.yaml", HppPlan).model_input == measured.model_input

    code, _, err = cli("profile", "--cluster", "budgeted.yaml", "--model", model, "--batch-sizes", "4",
                       "--out", "profile.json")
    assert code == 0, err
    code, _, err = cli("plan", "--profile", "profile.json", "--strategy", "asteroid", "--global-batch", "16",
                       "--micro-batch", "4", "--out", "plan.yaml")
    assert code == 0, err
    plan = load(tmp_path / "plan.yaml", HppPlan)
    assert plan.model == model and plan.model_input == ModelInput(shape=[3, 8, 8])
    assert [s.devices for s in plan.stages] == [["w0"], ["w1"], ["w2"]], plan.stages
    code, _, err = cli("run", "--plan", "plan.yaml", "--cluster", "local.yaml", *TRAINING, "--save-model", "pipe.pt")
    assert code == 0, err

    # the reference: the same module, seed, data and optimizer, data-parallel on a single device
    code, _, err = cli("profile", "--cluster", "one.yaml", "--model", model, "--batch-sizes", "4", "--out", "one.json")
    assert code == 0, err
    code, _, err = cli("plan", "--profile", "one.json", "--strategy", "dp", "--global-batch", "16",
                       "--micro-batch", "4", "--out", "dp.yaml")
    assert code == 0, err
    assert [s.devices for s in load(tmp_path / "dp.yaml", HppPlan).stages] == [["w0"]]
    code, _, err = cli("run", "--plan", "dp.yaml", "--cluster", "one-local.yaml", *TRAINING, "--save-model", "dp.pt")
    assert code == 0, err

    pipelined, single = torch.load(tmp_path / "pipe.pt"), torch.load(tmp_path / "dp.pt")
    assert sorted(pipelined) == sorted(single)
    for key in single:
        torch.testing.assert_close(pipelined[key], single[key], rtol=1e-4, atol=1e-6, msg=lambda m: f"{key}: {m}")
    fresh = import_factory(model, "--model")()[0].state_dict()
    assert any(not torch.equal(single[k], fresh[k]) for k in fresh)  # it trained (and kept the names)

    # the saved file is the module's own state dict: a plain python, hppctl not importable, loads it
    script = (
        "import sys; sys.modules['hppctl'] = None\n"
        "import torch\n"
        f"import {name} as user\n"
        "net = user.WideHead()\n"
        "state = torch.load('pipe.pt')\n"
        "net.load_state_dict(state)\n"
        "assert all(torch.equal(net.state_dict()[k], v) for k, v in state.items())\n"
        "try:\n    import hppctl\nexcept ImportError:\n    print('loaded without hppctl', len(state))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"loaded without hppctl {len(single)}"


def test_a_run_whose_module_is_gone_stops_before_any_worker(cli, tmp_path, monkeypatch):
    """The plan names a module that no longer imports: one line, exit 2, nothing written, no worker
    (the --log file every worker's output goes to is never opened)."""
    monkeypatch.chdir(tmp_path)
    name = write_module(tmp_path, RESNET)
    (tmp_path / "local.yaml").write_text(THREE_LOCAL)
    (tmp_path / "presets.yaml").write_text(THREE_LOCAL.replace("local: true", "preset: rpi4"))
    code, _, err = cli("profile", "--cluster", "presets.yaml", "--model", f"{name}:make", "--out", "profile.json")
    assert code == 0, err
    code, _, err = cli("plan", "--profile", "profile.json", "--strategy", "pp", "--global-batch", "16",
                       "--micro-batch", "4", "--out", "plan.yaml")
    assert code == 0, err
    (tmp_path / f"{name}.py").write_text(RESNET.replace("def make():", "def renamed():"))
    sys.modules.pop(name, None)
    code, out, err = cli("run", "--plan", "plan.yaml", "--cluster", "local.yaml", "--rounds", "1",
                         "--save-model", "m.pt", "--log", "workers.log", "--metrics", "m.jsonl")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"cannot import '{name}:make'" in err
    for written in ("m.pt", "workers.log", "m.jsonl"):
        assert not (tmp_path / written).exists()


def test_the_input_shape_flag_reaches_the_workers_through_the_plan(cli, tmp_path, monkeypatch):
    """`bare()` returns the module alone: only `--input-shape` at `hppctl profile` says what a sample is.
    The profile records it, the plan copies it and every worker's config carries it: `plan` and `run`
    are given no flag, and two workers build and train the model."""
    monkeypatch.chdir(tmp_path)
    name = write_module(tmp_path, RESNET)
    (tmp_path / "presets.yaml").write_text(
        "name: p\ndevices:\n  - {name: a, preset: rpi4}\n  - {name: b, preset: rpi4}\n")
    (tmp_path / "local.yaml").write_text("name: l\ndevices:\n  - {name: a, local: true}\n  - {name: b, local: true}\n")
    code, _, err = cli("profile", "--cluster", "presets.yaml", "--model", f"{name}:bare", "--input-shape", "3x8x8",
                       "--out", "profile.json")
    assert code == 0, err
    code, _, err = cli("plan", "--profile", "profile.json", "--strategy", "pp", "--global-batch", "8",
                       "--micro-batch", "4", "--out", "plan.yaml")
    assert code == 0, err
    assert len(load(tmp_path / "plan.yaml", HppPlan).stages) == 2
    # a fresh `hppctl run` process: nothing of the profile command's flags is left in it
    done = subprocess.run([sys.executable, "-m", "hppctl", "run", "--plan", "plan.yaml", "--cluster", "local.yaml",
                           "--rounds", "2", "--threads", "1", "--save-model", "m.pt"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert torch.load(tmp_path / "m.pt")["classifier.weight"].shape == (10, 6)


def test_demo_takes_a_user_model(cli, tmp_path, monkeypatch):
    """`hppctl demo --model package.module:factory --input-shape …`: its profile records the input, and the
    three local workers train the module (asteroid plan, digits resized to its input)."""
    import json

    monkeypatch.chdir(tmp_path)
    name = write_module(tmp_path, RESNET)
    code, out, err = cli("demo", "--model", f"{name}:bare", "--input-shape", "3x8x8", "--epochs", "1",
                         "--out-dir", "demo", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["model"] == f"{name}:bare" and summary["rounds_run"] > 0
    assert json.loads((tmp_path / "demo" / "profile.json").read_text())["model_input"] == {
        "shape": [3, 8, 8], "dtype": "float32"}
    assert "classifier.weight" in torch.load(tmp_path / "demo" / "model.pt")
