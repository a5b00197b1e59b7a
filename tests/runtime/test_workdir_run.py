"""`hppctl run --workdir` on real local workers (gloo): a dataset factory that lives only in the
workdir trains, and one that does not import on a device fails the run before any worker trains,
naming the device (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hppctl.store import save
from tests.runtime.factories import local_cluster, make_plan

REPO = Path(__file__).resolve().parents[2]

DATASET = '''\
import sys

import torch
from torch.utils.data import Dataset

{guard}

class Features(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((32,), float(i) / 64), i % 10


def features():
    return Features(), Features()
'''

WORKERS_ONLY = '''\
if sys.argv[0].endswith("worker.py"):  # a dependency the devices lack, the launcher has
    import wdrun_missing_on_the_devices  # noqa: F401
'''


def files(tmp_path: Path, module: str, guard: str = "") -> tuple[Path, Path, Path]:
    """A two-stage tiny-mlp plan on local workers a, b, c and a workdir holding only `module`.py,
    outside the directory the run starts in."""
    workdir = tmp_path / "code"
    (workdir / "sub").mkdir(parents=True)
    (workdir / f"{module}.py").write_text(DATASET.format(guard=guard))
    save(tmp_path / "plan.yaml", make_plan("tiny-mlp", [((0, 2), ["a", "b"], [3, 1]), ((2, 5), ["c"], [4])],
                                           global_batch=16, micro_batch=4))
    save(tmp_path / "cluster.yaml", local_cluster("a", "b", "c"))
    return tmp_path / "plan.yaml", tmp_path / "cluster.yaml", workdir


def hppctl(*args, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, from a directory that does not hold the dataset's module."""
    return subprocess.run([sys.executable, "-m", "hppctl", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, timeout=240)


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_a_dataset_factory_that_lives_only_in_the_workdir_trains(tmp_path):
    plan, cluster, workdir = files(tmp_path, "wdrun_data")
    run = tmp_path / "elsewhere"
    run.mkdir()
    done = hppctl("run", "--plan", plan, "--cluster", cluster, "--dataset", "wdrun_data:features", "--rounds", "3",
                  "--workdir", workdir, "--json", cwd=run)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["rounds_run"] == 3 and summary["test_accuracy"] is not None
    shipped = summary["workdir"]
    assert shipped["path"] == str(workdir) and shipped["files"] == 1
    assert shipped["sent_bytes"] == {"a": None, "b": None, "c": None} and shipped["sent_total_bytes"] == 0
    assert f"workdir {shipped['digest'][:12]} (1 files, " in done.stderr
    assert "used in place on a, b, c" in done.stderr
    # without --workdir the same command cannot find the module (on the launcher, before any worker)
    alone = hppctl("run", "--plan", plan, "--cluster", cluster, "--dataset", "wdrun_data:features", "--rounds", "3",
                   cwd=run)
    assert alone.returncode == 2 and "No module named 'wdrun_data'" in alone.stderr


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_a_module_that_does_not_import_on_a_device_fails_before_training_naming_it(tmp_path):
    plan, cluster, workdir = files(tmp_path, "wdrun_broken", guard=WORKERS_ONLY)
    metrics = tmp_path / "m.jsonl"
    done = hppctl("run", "--plan", plan, "--cluster", cluster, "--dataset", "wdrun_broken:features", "--rounds", "3",
                  "--workdir", workdir, "--metrics", metrics, "--json", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert errors[0].startswith("error: device '") and errors[0][15] in "abc"
    assert ("--dataset wdrun_broken:features: cannot import 'wdrun_broken' on that device "
            "(ModuleNotFoundError: No module named 'wdrun_missing_on_the_devices')") in errors[0]
    assert json.loads(done.stdout)["error"]["kind"] == "bad_input"
    assert not metrics.exists() or metrics.read_text() == ""  # no worker trained a round
    assert "training: done" not in done.stderr


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_psl_run_takes_its_dataset_factory_from_the_workdir(tmp_path):
    """The PSL launcher is the same skeleton: its clients and helpers get the workdir too."""
    from tests.psl.test_runtime import CLIENTS, HELPERS, tiny_plan

    _, _, workdir = files(tmp_path, "wdpsl_data")
    save(tmp_path / "psl.yaml", tiny_plan("tiny-mlp", cuts=((1, 3), (2, 4), (1, 3))))
    save(tmp_path / "psl-cluster.yaml", local_cluster(*CLIENTS, *HELPERS))
    done = hppctl("psl", "run", "--plan", tmp_path / "psl.yaml", "--cluster", tmp_path / "psl-cluster.yaml",
                  "--dataset", "wdpsl_data:features", "--workdir", workdir, "--threads", "1", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shipped = json.loads(done.stdout)["workdir"]
    assert set(shipped["sent_bytes"]) == {*CLIENTS, *HELPERS} and shipped["sent_total_bytes"] == 0


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_an_inference_run_takes_a_workdir_too(tmp_path):
    """Galaxy workers live the same worker life: their config carries the workdir (no user module yet)."""
    _, _, workdir = files(tmp_path, "wdinf_unused")
    done = hppctl("run", "--plan", REPO / "examples/galaxy-local.yaml", "--cluster", REPO / "examples/local.yaml",
                  "--seq-len", "16", "--workdir", workdir, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shipped = json.loads(done.stdout)["workdir"]
    assert shipped["path"] == str(workdir) and set(shipped["sent_bytes"]) == {"w0", "w1", "w2"}
