"""`lab down` removes only what it can prove is its own (issue 23, item 11).

- two real labs in different state dirs: `down --state-dir <A's>` without --name removes A and
  leaves B's namespaces and sshd running, also once A's dir holds no lab any more (it used to
  sweep anything named like a lab, on the whole machine);
- a tampered state.json whose state dir or cgroups point elsewhere: refused, nothing removed;
- `lab status` on a lab whose cgroups are gone (no memory limit readable): a table, not a TypeError.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hppctl.errors import BadInput
from hppctl.lab.layout import cgroup_lab_dir_name, lab_tag, netns_name, veth_name
from hppctl.lab import manager
from hppctl.lab.manager import STATE_FILE
from hppctl.models.lab import HostState, LabState
from hppctl.store import save

LAB_A, LAB_B = "pytest-owna", "pytest-ownb"
SPEC = "name: {name}\nsubnet: {subnet}\nhosts:\n  - {{name: h, cpu: 0.25, memory: 128MB}}\n"


def _lab_state(name: str, state_dir: Path, cgroup_root: Path, **changes) -> LabState:
    """A state record as `lab up` writes it (one host), with `changes` applied to it."""
    tag = lab_tag(name)
    lab_dir = cgroup_root / cgroup_lab_dir_name(name)
    host = HostState(name="h", address="10.213.250.2", netns=netns_name(name, "h"), veth=veth_name(tag, 0),
                     cpu=0.25, memory_bytes=128 * 10**6, bandwidth_bytes_per_s=1e6, cgroups=[str(lab_dir / "h")])
    state = LabState(name=name, tag=tag, state_dir=str(state_dir), subnet="10.213.250.0/24",
                     bridge=f"hpb{tag}", cgroup_lab_dirs=[str(lab_dir)], hosts=[host])
    return state.model_copy(update=changes)


# --- pure: the containment check --------------------------------------------------------------------


def test_check_owned_accepts_what_up_records(tmp_path):
    manager.check_owned(_lab_state("own", tmp_path / "own", tmp_path / "cg"), tmp_path / "own", [tmp_path / "cg"])


@pytest.mark.parametrize("field, tamper", [
    ("state_dir", lambda s, t: s.model_copy(update={"state_dir": str(t / "elsewhere")})),
    ("state_dir", lambda s, t: s.model_copy(update={"state_dir": str(t / "own" / ".." / "elsewhere")})),
    ("cgroup_lab_dirs", lambda s, t: s.model_copy(update={"cgroup_lab_dirs": [str(t / "victim")]})),
    ("cgroup_lab_dirs", lambda s, t: s.model_copy(update={"cgroup_lab_dirs": [str(t / "cg" / "hppctl-lab-other")]})),
    ("cgroup_lab_dirs", lambda s, t: s.model_copy(update={"cgroup_lab_dirs": [str(t / "hppctl-lab-own")]})),
    ("hosts.0.cgroups", lambda s, t: s.model_copy(update={"hosts": [s.hosts[0].model_copy(
        update={"cgroups": [str(t / "cg" / "hppctl-lab-own" / ".." / "..")]})]})),
    ("hosts.0.netns", lambda s, t: s.model_copy(update={"hosts": [s.hosts[0].model_copy(
        update={"netns": "hppctl-lab-other-h"})]})),
    ("hosts.0.veth", lambda s, t: s.model_copy(update={"hosts": [s.hosts[0].model_copy(update={"veth": "eth0"})]})),
    ("bridge", lambda s, t: s.model_copy(update={"bridge": "docker0"})),
    ("tag", lambda s, t: s.model_copy(update={"tag": "000000"})),
])
def test_check_owned_refuses_paths_and_names_outside_the_lab(tmp_path, field, tamper):
    state = tamper(_lab_state("own", tmp_path / "own", tmp_path / "cg"), tmp_path)
    with pytest.raises(BadInput) as refused:
        manager.check_owned(state, tmp_path / "own", [tmp_path / "cg"])
    message = str(refused.value)
    assert field in message and str(tmp_path / "own" / STATE_FILE) in message and "\n" not in message


def test_down_refuses_a_tampered_state_and_removes_nothing(tmp_path, cli):
    """state.json pointing its state dir and cgroup at directories outside the lab: exit 2, both kept."""
    if os.geteuid() != 0:
        pytest.skip("lab down needs root")
    root = tmp_path / "state"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / STATE_FILE).write_text("{}")  # what `down` looks for before removing a state dir
    (victim / "precious").write_text("keep me")
    empty_victim = tmp_path / "empty-victim"
    empty_victim.mkdir()
    state = _lab_state("pytest-tampered", victim, tmp_path / "cg", cgroup_lab_dirs=[str(empty_victim)])
    save(root / "pytest-tampered" / STATE_FILE, state)
    code, out, err = cli("lab", "down", "--state-dir", root)
    assert code == 2, err
    assert "state_dir" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert (victim / "precious").read_text() == "keep me" and empty_victim.is_dir()
    assert (root / "pytest-tampered" / STATE_FILE).exists()


# --- status after the cgroups are gone ----------------------------------------------------------------


def test_status_shows_a_lab_whose_cgroups_are_gone(tmp_path, cli):
    """After a sweep removed a lab's cgroups (or on a host without a memory limit), the cgroup reads
    no limit: the table shows "-" where it used to raise TypeError in format_bytes."""
    root = tmp_path / "state"
    save(root / "gone" / STATE_FILE, _lab_state("gone", root / "gone", tmp_path / "no-cgroups"))
    code, out, err = cli("lab", "status", "--state-dir", root)
    assert code == 0, err
    assert "gone" in out and "Traceback" not in err
    code, out, err = cli("lab", "status", "--json", "--state-dir", root)
    assert code == 0, err
    [host] = json.loads(out)["labs"][0]["hosts"]
    assert host["memory_limit_bytes"] is None and host["memory_limit_recorded_bytes"] == 128 * 10**6


# --- live: two labs, one down ------------------------------------------------------------------------


def _up(cli, tmp_path: Path, name: str) -> Path:
    from tests.lab.conftest import free_subnet

    state_dir = tmp_path / f"state-{name}"
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, subnet=free_subnet()))
    cli("lab", "down", "--name", name, "--state-dir", state_dir)  # a crashed earlier run's leftovers
    code, _, err = cli("lab", "up", "--spec", spec, "--state-dir", state_dir)
    assert code == 0, err
    return state_dir


def _sshd_pid(state_dir: Path, name: str) -> int:
    state = json.loads((state_dir / name / STATE_FILE).read_text())
    return state["hosts"][0]["sshd_pid"]


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


@pytest.mark.lab
@pytest.mark.timeout(300)
def test_down_without_name_leaves_another_state_dirs_lab_alone(tmp_path, cli):
    dir_a = _up(cli, tmp_path, LAB_A)
    try:
        dir_b = _up(cli, tmp_path, LAB_B)
        try:
            b_sshd = _sshd_pid(dir_b, LAB_B)
            # A's dir holds one lab: that one goes, B stays.
            code, _, err = cli("lab", "down", "--state-dir", dir_a)
            assert code == 0, err
            assert not Path("/run/netns", netns_name(LAB_A, "h")).exists()
            assert Path("/run/netns", netns_name(LAB_B, "h")).exists() and _alive(b_sshd)
            # A's dir now holds no lab: nothing of B goes, and B is named as seen.
            code, out, err = cli("lab", "down", "--state-dir", dir_a)
            assert code == 0, err
            assert Path("/run/netns", netns_name(LAB_B, "h")).exists() and _alive(b_sshd)
            assert LAB_B in err and "left alone" in err
            code, out, err = cli("lab", "status", "--json", "--state-dir", dir_b)
            assert code == 0, err
            assert json.loads(out)["labs"][0]["hosts"][0]["ssh_answers"] is True
        finally:
            cli("lab", "down", "--name", LAB_B, "--state-dir", dir_b)
    finally:
        cli("lab", "down", "--name", LAB_A, "--state-dir", dir_a)
    assert not subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count("pytest-own")
