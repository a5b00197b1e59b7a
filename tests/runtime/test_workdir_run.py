"""`hppctl run --workdir` on real local workers (gloo): a dataset factory that lives only in the
workdir trains, and one that does not import on a device fails the run before any worker trains,
naming the device (exit 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hppctl import usercode
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


@pytest.fixture
def hppctl(cli, monkeypatch):
    """The CLI in this process (its local workers fork from the session's zygote), run from a
    directory that does not hold the dataset's module; the user modules and the import root it
    leaves are cleared afterwards."""
    before = set(sys.modules)

    def invoke(*args, cwd: Path) -> tuple[int, str, str]:
        monkeypatch.chdir(cwd)
        return cli(*args)

    yield invoke
    usercode.set_root(None)
    for name in set(sys.modules) - before:
        if name.startswith("wd"):
            del sys.modules[name]


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_a_dataset_factory_that_lives_only_in_the_workdir_trains(hppctl, tmp_path):
    plan, cluster, workdir = files(tmp_path, "wdrun_data")
    run = tmp_path / "elsewhere"
    run.mkdir()
    code, out, err = hppctl("run", "--plan", plan, "--cluster", cluster, "--dataset", "wdrun_data:features",
                            "--rounds", "3", "--workdir", workdir, "--json", cwd=run)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["rounds_run"] == 3 and summary["test_accuracy"] is not None
    shipped = summary["workdir"]
    assert shipped["path"] == str(workdir) and shipped["files"] == 1
    assert shipped["sent_bytes"] == {"a": None, "b": None, "c": None} and shipped["sent_total_bytes"] == 0
    assert f"workdir {shipped['digest'][:12]} (1 files, " in err and "used in place on a, b, c" in err
    # without --workdir the same command cannot find the module (on the launcher, before any worker)
    sys.modules.pop("wdrun_data", None)
    code, _, err = hppctl("run", "--plan", plan, "--cluster", cluster, "--dataset", "wdrun_data:features",
                          "--rounds", "3", cwd=run)
    assert code == 2 and "No module named 'wdrun_data'" in err


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_a_module_that_does_not_import_on_a_device_fails_before_training_naming_it(hppctl, tmp_path):
    plan, cluster, workdir = files(tmp_path, "wdrun_broken", guard=WORKERS_ONLY)
    metrics = tmp_path / "m.jsonl"
    code, out, err = hppctl("run", "--plan", plan, "--cluster", cluster, "--dataset", "wdrun_broken:features",
                            "--rounds", "3", "--workdir", workdir, "--metrics", metrics, "--json", cwd=tmp_path)
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith("error: device '") and errors[0][15] in "abc"
    assert ("--dataset wdrun_broken:features: cannot import 'wdrun_broken' on that device "
            "(ModuleNotFoundError: No module named 'wdrun_missing_on_the_devices')") in errors[0]
    assert json.loads(out)["error"]["kind"] == "bad_input"
    assert not metrics.exists() or metrics.read_text() == ""  # no worker trained a round
    assert "training: done" not in err


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_psl_run_takes_its_dataset_factory_from_the_workdir(hppctl, tmp_path):
    """The PSL launcher is the same skeleton: its clients and helpers get the workdir too."""
    from tests.psl.test_runtime import CLIENTS, HELPERS, tiny_plan

    _, _, workdir = files(tmp_path, "wdpsl_data")
    save(tmp_path / "psl.yaml", tiny_plan("tiny-mlp", cuts=((1, 3), (2, 4), (1, 3))))
    save(tmp_path / "psl-cluster.yaml", local_cluster(*CLIENTS, *HELPERS))
    code, out, err = hppctl("psl", "run", "--plan", tmp_path / "psl.yaml", "--cluster", tmp_path / "psl-cluster.yaml",
                            "--dataset", "wdpsl_data:features", "--workdir", workdir, "--threads", "1", "--json",
                            cwd=tmp_path)
    assert code == 0, err
    shipped = json.loads(out)["workdir"]
    assert set(shipped["sent_bytes"]) == {*CLIENTS, *HELPERS} and shipped["sent_total_bytes"] == 0


@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_an_inference_run_takes_a_workdir_too(hppctl, tmp_path):
    """Galaxy workers live the same worker life: their config carries the workdir (no user module yet)."""
    _, _, workdir = files(tmp_path, "wdinf_unused")
    code, out, err = hppctl("run", "--plan", REPO / "examples/galaxy-local.yaml", "--cluster",
                            REPO / "examples/local.yaml", "--seq-len", "16", "--workdir", workdir, "--json", cwd=tmp_path)
    assert code == 0, err
    shipped = json.loads(out)["workdir"]
    assert shipped["path"] == str(workdir) and set(shipped["sent_bytes"]) == {"w0", "w1", "w2"}
