"""`hppctl check` on a real 3-host edge lab (issue 25, item 9): it passes; a host whose Python runs
another hppctl, one whose Python cannot import hppctl, and one whose sshd was stopped fail naming
that host. Needs root; no wall-clock assertions (the measured times: docs/runtime.md, "hppctl check")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hppctl import __version__

pytestmark = [pytest.mark.lab, pytest.mark.gloo, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
NAME = "pytest-check"
SPEC = f"""\
name: {NAME}
bandwidth: 100mbit
subnet: {{subnet}}
hosts:
  - {{name: ka, cpu: 0.5, memory: 1GB}}
  - {{name: kb, cpu: 0.5, memory: 1GB}}
  - {{name: kc, cpu: 0.5, memory: 1GB}}
"""


def hppctl(*argv, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hppctl", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from tests.lab.conftest import built_lab

    with built_lab(tmp_path_factory, NAME, SPEC) as built:
        yield built.cluster_file, built.state_dir


def test_a_three_host_lab_passes(lab):
    cluster_file, _ = lab
    done = hppctl("check", "--cluster", cluster_file)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[2].startswith("ok   devices") and all(f"{h} (10." in lines[2] for h in ("ka", "kb", "kc"))
    assert lines[3].startswith("ok   train") and "ka, kb | kc" in lines[3]
    assert lines[-1].startswith("check passed in ")


def with_python(cluster_file: Path, device: str, where: Path, script: str) -> Path:
    """A copy of `cluster_file` whose `device` runs `python:` = a shell script with `script` as its body."""
    import yaml

    wrapper = where / f"python-{device}"
    wrapper.write_text(f"#!/bin/sh\n{script}\n")
    wrapper.chmod(0o755)
    doc = yaml.safe_load(cluster_file.read_text())
    for spec in doc["devices"]:
        if spec["name"] == device:
            spec["python"] = str(wrapper)
    changed = where / f"cluster-{device}.yaml"
    changed.write_text(yaml.safe_dump(doc))
    return changed


def test_a_host_whose_python_runs_another_hppctl_fails_naming_it(lab, tmp_path):
    """kb's `python:` is a real interpreter that imports an hppctl of another version first."""
    other = tmp_path / "other" / "hppctl"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text('__version__ = "0.0.1"\n')
    mixed = with_python(lab[0], "kb", tmp_path, f'PYTHONPATH={other.parent} exec {sys.executable} "$@"')
    done = hppctl("check", "--cluster", mixed, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = json.loads(done.stdout)["verdict"]
    assert verdict.startswith("check FAILED: device 'kb' (10.") and f"hppctl 0.0.1 there, {__version__} here" in verdict
    assert "'ka'" not in verdict and "'kc'" not in verdict


def test_a_host_whose_python_cannot_import_hppctl_fails_naming_it(lab, tmp_path):
    """kc's `python:` is this interpreter without its site-packages (`-S`): no hppctl there."""
    bare = with_python(lab[0], "kc", tmp_path, f'exec {sys.executable} -S "$@"')
    done = hppctl("check", "--cluster", bare)
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = done.stdout.splitlines()[-1]
    assert verdict.startswith("check FAILED: device 'kc' (10.") and "cannot import hppctl there" in verdict
    assert "No module named 'hppctl'" in verdict


def test_a_host_whose_sshd_is_stopped_fails_naming_it(lab):
    """Last in this module: kb stays unreachable until `lab down`."""
    cluster_file, state_dir = lab
    status = json.loads(hppctl("lab", "status", "--name", NAME, "--state-dir", state_dir, "--json").stdout)
    [kb] = [h for h in status["labs"][0]["hosts"] if h["name"] == "kb"]
    os.kill(kb["sshd_pid"], signal.SIGTERM)  # the listener only: no session is open
    done = hppctl("check", "--cluster", cluster_file)
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = done.stdout.splitlines()[-1]
    assert verdict.startswith("check FAILED: device 'kb' (root@10.") and "connection refused" in verdict
    assert "'ka'" not in verdict and "'kc'" not in verdict
