"""`hppctl run --workdir` on a real 2-host edge lab (issue 27, item 2; needs root): the first run
sends the workdir over SSH, an unchanged workdir is not sent again (0 bytes in the summary), a
changed one is; a module that does not import on one host fails the run naming that host (exit 2).

The lab's hosts share this machine's file system, so they share one cache
(`/root/.cache/hppctl/workdirs/<digest>`): the first host a run reaches installs it, the second
finds it. No wall-clock assertions (the measured bytes: docs/runtime.md, "Your code: --workdir")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from hppctl.store import save
from tests.runtime.factories import make_plan
from tests.runtime.test_workdir_run import DATASET

pytestmark = [pytest.mark.lab, pytest.mark.gloo, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
NAME = "pytest-workdir"
SPEC = f"""\
name: {NAME}
bandwidth: 100mbit
subnet: {{subnet}}
hosts:
  - {{name: wa, cpu: 0.5, memory: 1GB}}
  - {{name: wb, cpu: 0.5, memory: 1GB}}
"""

PICKY = """\
import os
if os.environ.get("HPPCTL_LAB_HOST") in {hosts}:  # a dependency one host lacks
    import wdlab_not_on_this_host  # noqa: F401
"""
"""The workdir dataset's guard (tests/runtime/test_workdir_run.py DATASET): fails to import on `hosts`."""


def dataset(hosts: str = "()") -> str:
    return DATASET.format(guard=PICKY.format(hosts=hosts))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The lab, its cluster file with each host's `python:` running this checkout's hppctl, and a plan."""
    from tests.lab.conftest import built_lab, checkout_cluster

    with built_lab(tmp_path_factory, NAME, SPEC) as built:
        cluster = checkout_cluster(built)
        plan = built.root / "plan.yaml"
        save(plan, make_plan("tiny-mlp", [((0, 2), ["wa"], [4]), ((2, 5), ["wb"], [4])], global_batch=16,
                             micro_batch=4))
        yield cluster, plan


def hppctl(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hppctl", *map(str, argv)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300, cwd=cwd)


def run(lab, workdir: Path, dataset: str, cwd: Path) -> subprocess.CompletedProcess:
    cluster, plan = lab
    return hppctl("run", "--plan", plan, "--cluster", cluster, "--dataset", dataset, "--rounds", "2",
                  "--workdir", workdir, "--json", cwd=cwd)


def test_an_unchanged_workdir_is_not_sent_again(lab, tmp_path):
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "wdlab_data.py").write_text(dataset())
    (workdir / "wdlab_nonce.py").write_text(f"NONCE = {uuid.uuid4().hex!r}\n")  # a digest no earlier run cached

    first = run(lab, workdir, "wdlab_data:features", tmp_path)
    assert first.returncode == 0, first.stderr
    shipped = json.loads(first.stdout)["workdir"]
    sent = shipped["sent_bytes"]
    assert set(sent) == {"wa", "wb"} and sent["wa"] == shipped["archive_bytes"] > 0
    assert sent["wb"] in (0, shipped["archive_bytes"])  # 0: wa's copy, in the file system the hosts share
    assert shipped["sent_total_bytes"] > 0
    cached = Path.home() / ".cache/hppctl/workdirs" / shipped["digest"]
    assert (cached / "wdlab_data.py").read_text() == (workdir / "wdlab_data.py").read_text()
    assert not [p for p in cached.parent.iterdir() if p.name.startswith(f".{shipped['digest']}")]  # no temporary left

    second = run(lab, workdir, "wdlab_data:features", tmp_path)
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)["workdir"]
    assert again["digest"] == shipped["digest"]
    assert again["sent_bytes"] == {"wa": 0, "wb": 0} and again["sent_total_bytes"] == 0
    assert f"workdir {again['digest'][:12]} (2 files, " in second.stderr and "cached on wa, wb" in second.stderr

    (workdir / "wdlab_nonce.py").write_text(f"NONCE = {uuid.uuid4().hex!r}\n")
    changed = run(lab, workdir, "wdlab_data:features", tmp_path)
    assert changed.returncode == 0, changed.stderr
    third = json.loads(changed.stdout)["workdir"]
    assert third["digest"] != shipped["digest"] and third["sent_bytes"]["wa"] == third["archive_bytes"] > 0


def test_a_module_that_does_not_import_on_one_host_fails_naming_it(lab, tmp_path):
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "wdlab_picky.py").write_text(dataset("('wb',)"))
    done = run(lab, workdir, "wdlab_picky:features", tmp_path)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: device 'wb': --dataset wdlab_picky:features: cannot import 'wdlab_picky' on that "
                      "device (ModuleNotFoundError: No module named 'wdlab_not_on_this_host')"], done.stderr
    assert "Traceback" not in done.stderr and "training: done" not in done.stderr


def test_a_device_that_cannot_unpack_the_workdir_fails_the_run_naming_it(lab, tmp_path):
    """wa's `python:` refuses `-c` programs (as a full disk would fail the unpack): one line, exit 1."""
    cluster, plan = lab
    broken = tmp_path / "python-wa"
    broken.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo "OSError: [Errno 28] No space left on device" >&2; '
                      f'exit 1; fi\nPYTHONPATH={ROOT} exec {sys.executable} "$@"\n')
    broken.chmod(0o755)
    doc = yaml.safe_load(cluster.read_text())
    doc["devices"][0]["python"] = str(broken)
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(doc))
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "wdlab_data.py").write_text(dataset())
    (workdir / "wdlab_nonce.py").write_text(f"NONCE = {uuid.uuid4().hex!r}\n")
    done = run((tmp_path / "cluster.yaml", plan), workdir, "wdlab_data:features", tmp_path)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: device 'wa': could not install --workdir "), done.stderr
    assert errors[0].endswith("OSError: [Errno 28] No space left on device") and "Traceback" not in done.stderr
    from hppctl.runtime.workdir import snapshot

    digest = snapshot(workdir).digest
    cache = Path.home() / ".cache/hppctl/workdirs"
    assert not [p for p in cache.iterdir() if digest in p.name]  # neither the upload nor a partial copy is left
