"""`hppctl profile --workdir DIR` on this machine (issue 27 item 2): the probes run with DIR first on
their import path (probe.py `--path`), so a probe kind or a model defined only in a file of DIR is
measured from any current directory; a DIR that fails `run`'s checks is one line, exit 2, before
any device is measured. The lab tier (tests/lab/test_profile_workdir_lab.py) ships DIR over SSH."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from hppctl import driver, usercode
from hppctl.models.cluster import ClusterSpec
from hppctl.profiling.remote import DeviceFailure, LocalEndpoint, ProbeCode
from hppctl.runtime.workdir import open_workdir, user_code

KIND = '''\
import sys

from hppctl.profiling.probe import register_kind


@register_kind("wd-where")
def where(args):
    import wdhelper  # a second module of the workdir, imported by the kind

    yield {"type": "where", "first": sys.path[0], "helper": wdhelper.__file__, "echo": args["echo"]}
'''

MODEL = '''\
"""A model defined only in this workdir: a 3-block MLP of its own input width, in the zoo's catalog."""
from hppctl.zoo.catalog import BUILTINS, ModelSpec

BUILTINS["wd-mlp"] = ModelSpec("wd-mlp", "train", "tiny-mlp", (24,), "an MLP defined only in a --workdir",
                               {"in_features": 24, "hidden": 40, "classes": 10, "blocks": 3})
'''


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A workdir with a probe kind and a model module, and a current directory that holds neither;
    the process's import root and registries are restored afterwards."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "wdkind.py").write_text(KIND)
    (code / "wdhelper.py").write_text("VALUE = 1\n")
    (code / "wdnet.py").write_text(MODEL)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    yield code
    from hppctl.zoo.catalog import BUILTINS

    BUILTINS.pop("wd-mlp", None)
    for name in ("wdkind", "wdhelper", "wdnet"):
        sys.modules.pop(name, None)
    usercode.set_root(None)


def probe_code(code: Path, *modules: str) -> ProbeCode:
    """The launcher's `ProbeCode` for `code` (driver.probe_code: runtime.workdir's check and install),
    with `modules` imported by every probe first."""
    shipped = open_workdir(code)
    return dataclasses.replace(driver.probe_code(user_code(shipped)), modules=modules)


def local_cluster(*names: str) -> ClusterSpec:
    return ClusterSpec.model_validate({"name": "here", "devices": [{"name": n, "local": True} for n in names]})


def test_a_probe_kind_defined_in_the_workdir_runs_with_the_workdir_first_on_its_path(workdir):
    endpoint = LocalEndpoint(local_cluster("a").devices[0])
    assert endpoint.use_code(probe_code(workdir)) is None  # a local device: used in place, nothing sent
    found = endpoint.probe("wd-where", {"echo": 7}, timeout=120, imports=["wdkind"])
    record = next(r for r in found if r.get("type") == "where")
    assert record["first"] == str(workdir.resolve()) and record["echo"] == 7
    assert record["helper"] == str(workdir.resolve() / "wdhelper.py")


def test_a_workdir_missing_on_the_device_is_that_devices_one_line(workdir, tmp_path):
    endpoint = LocalEndpoint(local_cluster("a").devices[0])
    code = dataclasses.replace(probe_code(workdir), local_path=str(tmp_path / "gone"))
    endpoint.use_code(code)
    with pytest.raises(DeviceFailure) as failed:
        endpoint.probe("wd-where", {"echo": 1}, timeout=120, imports=["wdkind"])
    assert failed.value.reason == f"FileNotFoundError: --workdir {tmp_path / 'gone'} is missing on this device"


def test_a_user_module_that_does_not_import_fails_the_device_before_it_is_measured(workdir, tmp_path):
    from hppctl.profiling.cluster import profile_cluster

    (workdir / "wdbroken.py").write_text("import wd_not_installed_anywhere\n")
    run = profile_cluster(local_cluster("a"), "tiny-mlp", batch_sizes=[1], measure_links=False,
                          cache_root=tmp_path / "cache", user_code=probe_code(workdir, "wdbroken"))
    assert run.profile is None and run.measured == {"a": []} and run.workdir == {"a": None}
    assert run.failures == {"a": "ImportFailed: cannot import 'wdbroken' on this device (ModuleNotFoundError: "
                                 "No module named 'wd_not_installed_anywhere')"}


def test_a_model_defined_only_in_the_workdir_is_profiled_from_another_directory(workdir, tmp_path):
    from hppctl.profiling.cluster import ProbeSettings, profile_cluster
    from hppctl.zoo import layer_costs

    code = probe_code(workdir, "wdnet")
    usercode.import_module("wdnet")  # the launcher's side: its import root is the workdir (open_workdir)
    settings = ProbeSettings(repeats=1, warmup=0, window_s=0.05, min_steps=1, threads=1)
    kwargs = dict(granularity="fine", batch_sizes=[1, 2], settings=settings, measure_links=False,
                  cache_root=tmp_path / "cache")
    run = profile_cluster(local_cluster("a"), "wd-mlp", user_code=code, **kwargs)
    assert run.failures == {} and run.workdir == {"a": None}
    device = run.profile.devices[0]
    assert device.source == "measured" and device.batch_sizes == [1, 2]
    assert len(device.forward_s) == len(layer_costs("wd-mlp", "fine")) == len(run.profile.layers)

    without = profile_cluster(local_cluster("a"), "wd-mlp", **kwargs, force=True)  # the probe cannot find it
    assert run.profile is not None and without.profile is None
    assert "wd-mlp" in without.failures["a"] and "unknown model" in without.failures["a"]


def test_profile_takes_workdir_and_reports_it_as_run_does(cli, workdir, tmp_path):
    cluster = tmp_path / "one.yaml"
    cluster.write_text("name: one\ndevices:\n  - {name: a, local: true}\n")
    out = tmp_path / "p.json"
    code, stdout, stderr = cli("profile", "--cluster", cluster, "--model", "tiny-mlp", "--batch-sizes", "1",
                               "--repeats", "1", "--warmup", "0", "--threads", "1", "--workdir", workdir,
                               "--out", out, "--json")
    assert code in (0, 1), stderr  # 1: this busy machine's times judged implausible is not this test's matter
    summary = json.loads(stdout)
    shipped = summary["workdir"]
    assert shipped["path"] == str(workdir.resolve()) and shipped["files"] == 3
    assert shipped["sent_bytes"] == {"a": None} and shipped["sent_total_bytes"] == 0
    assert f"workdir {shipped['digest'][:12]} (3 files, " in stderr and "used in place on a" in stderr
    assert usercode.root() == str(workdir.resolve())  # the launcher imports user modules from it


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_bad_workdir_is_one_line_exit_2_before_any_device_is_measured(cli, tmp_path, kind):
    """The host is unreachable: measuring it first would take the connect timeout and exit 1."""
    cluster = tmp_path / "far.yaml"
    cluster.write_text("name: far\nssh: {connect_timeout_s: 30}\ndevices:\n  - {name: far, host: 192.0.2.1}\n")
    bad = tmp_path / "nothing-here"
    if kind == "file":
        bad.write_text("not a directory\n")
    out = tmp_path / "p.json"
    code, stdout, stderr = cli("profile", "--cluster", cluster, "--model", "tiny-mlp", "--workdir", bad,
                               "--out", out)
    word = "no such directory" if kind == "missing" else "not a directory"
    assert code == 2 and stderr.strip() == f"error: --workdir: {bad}: {word}"
    assert not out.exists() and stdout == ""


def test_workdir_is_refused_with_seq_len(cli, workdir, tmp_path):
    """Inference profiles (Galaxy) measure built-in and hf: models: a workdir there would be ignored."""
    code, stdout, stderr = cli("profile", "--cluster", "examples/galaxy-local.yaml", "--model", "tiny-bert",
                               "--seq-len", "16", "--workdir", workdir)
    assert code == 2 and stdout == ""
    assert stderr.strip() == "error: --workdir: not taken with --seq-len (inference profiles measure built-in and hf: models)"


CNN = '''\
"""A model of your own: a small CNN with a residual branch, only in this workdir."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.branch = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = x + torch.relu(self.branch(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def make():
    return Net()
'''


def test_a_model_of_your_own_in_the_workdir_is_profiled_from_another_directory(cli, workdir, tmp_path, monkeypatch):
    """`--model package.module:factory` from the workdir, measured afresh: a cache of its own, since the
    measurements of the same module source are reused from any earlier profile on this machine (the
    fingerprint names the source by module, not path: zoo/user.py)."""
    monkeypatch.setenv("HPPCTL_CACHE_DIR", str(tmp_path / "cache"))
    (workdir / "wdcnn.py").write_text(CNN)
    cluster = tmp_path / "one.yaml"
    cluster.write_text("name: one\ndevices:\n  - {name: a, local: true}\n")
    out = tmp_path / "p.json"
    code, stdout, stderr = cli("profile", "--cluster", cluster, "--model", "wdcnn:make", "--input-shape", "3x8x8",
                               "--batch-sizes", "1,2", "--repeats", "1", "--warmup", "0", "--threads", "1",
                               "--workdir", workdir, "--out", out, "--json")
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["model"] == "wdcnn:make" and summary["failures"] == {} and summary["measured"] == {"a": [1, 2]}
    assert summary["workdir"]["sent_bytes"] == {"a": None}
