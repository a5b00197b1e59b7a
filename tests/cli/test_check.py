"""`hppctl check` (issue 25, item 9): a pass/fail smoke test with an exit code a CI job can act on.

The passing runs are a subprocess, as CI runs them, with real local workers over gloo; the failures
are real SSH attempts (an unresolvable name, a closed port) through the CLI in this process. The 3-host lab and a stopped sshd: tests/lab/test_check_lab.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hppctl.check import LEARNED_RATIO, ROUNDS, check_plan, judge_learning
from hppctl.models.cluster import ClusterSpec, DeviceSpec
from tests.runtime.factories import hppctl_watching_its_zygote

ROOT = Path(__file__).resolve().parents[2]


def hppctl(*argv, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hppctl", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_cluster(tmp_path: Path, devices: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(f"name: c\nssh: {{known_hosts: {tmp_path / 'known_hosts'}}}\ndevices:\n{devices}")
    (tmp_path / "known_hosts").write_text("")
    return path


# --- pass ------------------------------------------------------------------------------------------

@pytest.mark.gloo
def test_local_workers_pass_with_one_line_per_step_exit_0_and_one_json_document():
    """One run (the slow part of this file): the step lines (on stderr with --json, on stdout
    otherwise: the failures below) and the document; and its workers' zygote, a fork of the check's own
    process as `hppctl run`'s is (tests/runtime/test_local_start.py), not a second interpreter that
    imports torch again."""
    done, forked = hppctl_watching_its_zygote("check", "--json", "--timeout", "60", timeout=180, cwd=ROOT,
                                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert forked is True, (forked, done.stderr)
    lines = done.stderr.splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [["ok", "install"], ["ok", "cluster"], ["ok", "devices"],
                                                       ["ok", "train"]]
    assert "check0, check1 | check2" in lines[3] and f"over {ROUNDS} rounds" in lines[3]
    assert lines[4].startswith("check passed in ") and len(lines) == 5
    doc = json.loads(done.stdout)  # stdout holds the document alone
    assert doc["passed"] is True and doc["exit_code"] == 0 and doc["verdict"] == lines[4]
    assert [s["name"] for s in doc["steps"]] == ["install", "cluster", "devices", "train"]
    assert all(s["ok"] and s["seconds"] >= 0 and s["exit_code"] == 0 for s in doc["steps"])
    assert doc["steps"][1]["detail"] == "3 local workers (no --cluster): 3 devices (3 local): check0, check1, check2"


# --- fail ------------------------------------------------------------------------------------------

def test_a_closed_ssh_port_fails_naming_the_device_exit_1_before_any_worker(cli, tmp_path):
    port = closed_port()
    cluster = write_cluster(tmp_path, f"  - {{name: w0, local: true}}\n  - {{name: nx2, host: 127.0.0.1, port: {port}}}\n")
    code, out, err = cli("check", "--cluster", cluster)
    assert code == 1, out + err
    verdict = out.splitlines()[-1]
    assert verdict.startswith("check FAILED: device 'nx2' (127.0.0.1:") and "connection refused" in verdict
    assert "FAIL devices" in out and " train " not in out  # stops at the failed step


def test_an_unresolvable_host_is_bad_input_exit_2_and_json_says_so(cli, tmp_path):
    cluster = write_cluster(tmp_path, "  - {name: w0, local: true}\n  - {name: nx1, host: no-such-host.invalid}\n")
    code, out, err = cli("check", "--cluster", cluster, "--json")
    assert code == 2, out + err
    doc = json.loads(out)
    assert doc["passed"] is False and doc["exit_code"] == 2
    assert doc["verdict"].startswith("check FAILED: device 'nx1'") and "does not resolve" in doc["verdict"]
    assert [s["ok"] for s in doc["steps"]] == [True, True, False]


@pytest.mark.parametrize("devices, message", [
    ("  - {name: w0, local: true}\n  - {name: n1, preset: jetson-nano}\n",
     "devices: n1: preset devices are modelled, not real machines"),
    ("  - {name: w0, local: true}\n  - {name: w0, local: true}\n", "duplicate device names"),
])
def test_a_bad_cluster_file_is_one_error_line_exit_2(cli, tmp_path, devices, message):
    cluster = write_cluster(tmp_path, devices)
    code, out, err = cli("check", "--cluster", cluster)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {cluster}: ") and message in err
    assert len(err.splitlines()) == 1


def test_a_missing_cluster_file_and_a_bad_timeout_are_bad_input(cli, tmp_path):
    assert cli("check", "--cluster", tmp_path / "none.yaml")[0] == 2
    code, _, err = cli("check", "--timeout", "0")
    assert code == 2 and err.startswith("error: --timeout:")


# --- the learning verdict --------------------------------------------------------------------------

def test_a_loss_that_does_not_fall_far_enough_or_is_nan_or_cut_short_did_not_learn():
    falling = [2.3, 2.2] + [1.5] * (ROUNDS - 4) + [0.9, 0.8]
    assert judge_learning(falling)[0]
    flat = [2.3, 2.2] + [2.0] * (ROUNDS - 2)
    ok, text = judge_learning(flat)
    assert not ok and f"needs below {LEARNED_RATIO:g} x the start" in text
    assert not judge_learning(falling[:-1] + [float("nan")])[0]
    assert not judge_learning(falling[: ROUNDS - 1])[0]


# --- the plan: every device, pipeline and all-reduce -----------------------------------------------

@pytest.mark.parametrize("count, shape", [
    (1, [["d0"]]), (2, [["d0"], ["d1"]]), (3, [["d0", "d1"], ["d2"]]), (5, [["d0", "d1", "d2"], ["d3", "d4"]]),
])
def test_the_check_plan_uses_every_device_in_at_most_two_stages(count, shape):
    cluster = ClusterSpec(name="c", devices=[DeviceSpec(name=f"d{i}", local=True) for i in range(count)])
    plan = check_plan(cluster)
    assert [s.devices for s in plan.stages] == shape
    assert plan.stages[0].layers[0] == 0 and plan.stages[-1].layers[1] == 5  # all of tiny-mlp's layers
    assert all(sum(s.samples) == plan.micro_batch and min(s.samples) > 0 for s in plan.stages)
