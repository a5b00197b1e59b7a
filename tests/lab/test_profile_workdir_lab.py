"""`hppctl profile --workdir` on a real 2-host edge lab (issue 27 item 2; needs root): a model defined
only in a file of the workdir is measured on both hosts over SSH (the workdir installed on each
over the endpoint's own connection, the probes run with it first on their import path), and a
second profile with the same workdir sends 0 bytes to either host.

The lab's hosts share this machine's file system, so they share one cache
(`/root/.cache/hppctl/workdirs/<digest>`): the hosts are measured at once, so both may send it
the first time (the second rename loses the race and its copy is dropped, ssh.install_cached). A nonce file gives each test run a digest no earlier run cached. No wall-clock
assertions (the measured bytes: docs/profiling.md, "Your code: --workdir")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.runtime.test_profile_workdir import MODEL

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
NAME = "pytest-profwd"
SPEC = f"""\
name: {NAME}
bandwidth: 100mbit
subnet: {{subnet}}
hosts:
  - {{name: pa, cpu: 0.5, memory: 1GB}}
  - {{name: pb, cpu: 0.5, memory: 1GB}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The lab's cluster file with each host's `python:` running this checkout's hppctl."""
    from tests.lab.conftest import built_lab, checkout_cluster

    with built_lab(tmp_path_factory, NAME, SPEC) as built:
        path = checkout_cluster(built)
        yield path


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "wdnet.py").write_text(MODEL)
    (code / "wdnonce.py").write_text(f"NONCE = {uuid.uuid4().hex!r}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    yield code
    from hppctl import usercode
    from hppctl.zoo.catalog import BUILTINS

    BUILTINS.pop("wd-mlp", None)
    sys.modules.pop("wdnet", None)
    usercode.set_root(None)


def test_a_workdir_model_is_profiled_on_two_hosts_and_not_sent_again(cluster, workdir, tmp_path):
    from hppctl import usercode
    from hppctl.models.cluster import ClusterSpec
    from hppctl.profiling.cluster import ProbeSettings, profile_cluster
    from hppctl.store import load
    from hppctl.zoo import layer_costs
    from tests.runtime.test_profile_workdir import probe_code

    code = probe_code(workdir, "wdnet")
    usercode.import_module("wdnet")  # the launcher's side (open_workdir made the workdir its import root)
    settings = ProbeSettings(repeats=1, warmup=0, window_s=0.05, min_steps=1, threads=1)
    run = profile_cluster(load(cluster, ClusterSpec), "wd-mlp", batch_sizes=[1, 2], settings=settings,
                          measure_links=False, cache_root=tmp_path / "cache", user_code=code)
    assert run.failures == {}, run.failures
    from hppctl.runtime.workdir import snapshot

    shipped = snapshot(workdir)
    archive = len(shipped.archive)
    assert set(run.workdir) == {"pa", "pb"} and archive > 0
    # the hosts are reached at once: each sends it, or one finds the other's copy already renamed in place
    assert set(run.workdir.values()) <= {0, archive} and archive in run.workdir.values()
    installed = Path.home() / ".cache/hppctl/workdirs" / shipped.digest
    assert (installed / "wdnet.py").read_text() == MODEL
    layers = len(layer_costs("wd-mlp", "fine"))
    assert [(d.name, d.source, len(d.forward_s)) for d in run.profile.devices] == [("pa", "measured", layers),
                                                                                  ("pb", "measured", layers)]

    out = tmp_path / "again.json"
    again = subprocess.run([sys.executable, "-m", "hppctl", "profile", "--cluster", str(cluster), "--model", "tiny-mlp",
                            "--workdir", str(workdir), "--batch-sizes", "1", "--repeats", "1", "--warmup", "0",
                            "--threads", "1", "--no-links", "--out", str(out), "--json"],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path / "elsewhere",
                           env={**os.environ, "PYTHONPATH": str(ROOT), "HPPCTL_CACHE_DIR": str(tmp_path / "cache")})
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)["workdir"]
    assert summary["digest"] == shipped.digest and summary["archive_bytes"] == archive
    assert summary["sent_bytes"] == {"pa": 0, "pb": 0} and summary["sent_total_bytes"] == 0
    line = next(line for line in again.stderr.splitlines() if line.startswith(f"workdir {shipped.digest[:12]} "))
    assert line.startswith(f"workdir {shipped.digest[:12]} (2 files, ") and "cached on " in line
    assert "pa" in line and "pb" in line and "sent to" not in line


def test_a_model_of_your_own_in_the_workdir_is_profiled_on_two_hosts(cluster, tmp_path):
    """The issue's acceptance, profiling part: `--model package.module:factory` (zoo/user.py) for a module
    only in the workdir, on both hosts, then 0 bytes."""
    from tests.runtime.test_profile_workdir import CNN

    code = tmp_path / "mycode"
    code.mkdir()
    (code / "wdcnn.py").write_text(CNN)
    (code / "wdnonce.py").write_text(f"NONCE = {uuid.uuid4().hex!r}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def profile() -> dict:
        done = subprocess.run([sys.executable, "-m", "hppctl", "profile", "--cluster", str(cluster), "--model",
                               "wdcnn:make", "--input-shape", "3x8x8", "--workdir", str(code), "--batch-sizes", "1,2",
                               "--repeats", "1", "--warmup", "0", "--threads", "1", "--no-links",
                               "--out", str(tmp_path / "mine.json"), "--json"],
                              capture_output=True, text=True, timeout=600, cwd=elsewhere,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "HPPCTL_CACHE_DIR": str(tmp_path / "cache")})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = profile()
    assert first["failures"] == {} and [d["name"] for d in first["devices"]] == ["pa", "pb"]
    archive = first["workdir"]["archive_bytes"]
    assert set(first["workdir"]["sent_bytes"].values()) <= {0, archive} and first["workdir"]["sent_total_bytes"] > 0
    second = profile()
    assert second["workdir"]["sent_bytes"] == {"pa": 0, "pb": 0} and second["layers"] == first["layers"]
