"""A run whose store address leaves the machine mid-run fails in seconds with one line, not a hang.

Tier 3 (root): the run lives in a network namespace of its own (`unshare -n`) whose only
non-loopback address sits on a veth, and the test takes the address away after the first round; or
the run trains on two SSH hosts of a lab, and the test takes the lab bridge's address away. Before
runtime/address_watch.py the launcher blocked in torch's store client `recv` (its timeout did not
bound it) for as long as the kernel kept retransmitting, ~15 minutes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ADDRESS = "10.213.250.1"
"""Private to the test's own network namespace: no lab or host on the machine sees it."""

SCENARIO = """
set -u
ip link set lo up
ip link add hl0 type veth peer name hl1
ip addr add {address}/24 dev hl0
ip link set hl0 up
ip link set hl1 up
{hppctl} run --plan plan.yaml --cluster cluster.yaml --rounds 100000 --dataset digits --metrics m.jsonl \\
    --listen {address}:0 {extra} > out.txt 2> err.txt &
run=$!
for _ in $(seq 1200); do [ -s m.jsonl ] && break; kill -0 $run 2>/dev/null || break; sleep 0.1; done
ip addr del {address}/24 dev hl0
wait $run
"""


@pytest.mark.lab
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault_tolerant", [False, True])
def test_a_run_whose_store_address_goes_away_fails_with_one_line(cli, tmp_path, fault_tolerant):
    from hppctl.store import save
    from tests.recovery.factories import preset_profile
    from tests.runtime.factories import local_cluster

    save(tmp_path / "cluster.yaml", local_cluster("a", "b"))
    save(tmp_path / "profile.json", preset_profile("tiny-mlp", {"a": "jetson-nano", "b": "jetson-tx2"}))
    assert cli("plan", "--profile", tmp_path / "profile.json", "--global-batch", 8, "--micro-batch", 4,
               "--strategy", "pp", "--out", tmp_path / "plan.yaml")[0] == 0
    script = SCENARIO.format(address=ADDRESS, hppctl=f"{sys.executable} -m hppctl",
                             extra="--profile profile.json" if fault_tolerant else "")
    scenario = subprocess.Popen(["unshare", "-n", "bash", "-c", script], cwd=tmp_path, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:  # the bound is the hang detector: the run takes seconds; before the watch it blocked ~15 minutes
        said, _ = scenario.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(scenario.pid, signal.SIGKILL)  # the run and its workers, should it hang again
    err = (tmp_path / "err.txt").read_text()
    assert (tmp_path / "m.jsonl").read_text().strip(), f"the run never trained a round:\n{err}\n{said}"
    assert scenario.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: the run's store address {ADDRESS} is no longer this machine's "
                      "(Cannot assign requested address): an interface went down or its address changed mid-run"], err
    assert "Traceback" not in err


LAB_SPEC = """\
name: pytest-addr
bandwidth: 100mbit
subnet: {subnet}
hosts:
  - {name: xa, cpu: 0.5, memory: 1GB}
  - {name: xb, cpu: 0.5, memory: 1GB}
"""


@pytest.mark.lab
@pytest.mark.gloo
@pytest.mark.timeout(300)
def test_a_run_over_ssh_whose_store_address_goes_away_fails_with_one_line(tmp_path_factory, tmp_path):
    """The case first met (2026-11-27): a lab removed under a run whose store listened on its bridge.
    The launcher's store calls are cut, and stopping the SSH workers asks the store nothing more (it
    printed torch's 50-line C++ trace per worker while looking up their pids). The workers, which can
    no longer be stopped from here, end by themselves once their store connection has been silent for
    `bootstrap.STORE_SILENCE_S` (before, they trained on: both still ran 90 s after the launcher)."""
    from hppctl.lab.network import sh
    from tests.lab.conftest import built_lab, checkout_cluster
    from tests.runtime.factories import make_plan
    from hppctl.store import save

    with built_lab(tmp_path_factory, "pytest-addr", LAB_SPEC) as lab:
        cluster = checkout_cluster(lab)
        save(tmp_path / "plan.yaml", make_plan("tiny-mlp", [((0, 2), ["xa"], [4]), ((2, 5), ["xb"], [4])],
                                               global_batch=8, micro_batch=4))
        bridge_address = lab.subnet.rsplit(".", 1)[0] + ".1"  # the host side of the lab's bridge: the route to its hosts
        metrics = tmp_path / "m.jsonl"
        run = subprocess.Popen([sys.executable, "-m", "hppctl", "run", "--plan", tmp_path / "plan.yaml", "--cluster",
                                cluster, "--rounds", "100000", "--dataset", "digits", "--metrics", metrics],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not (metrics.exists() and metrics.read_text().strip()) and run.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
            assert metrics.read_text().strip(), "the run never trained a round"
            bridge = sh(["ip", "-o", "-4", "addr", "show", "to", bridge_address]).stdout.split()[1]
            sh(["ip", "addr", "del", f"{bridge_address}/24", "dev", bridge])
            _, err = run.communicate(timeout=120)  # the hang detector
            # The hosts' workers cannot hear from the launcher either: nothing answers at its address
            # (no FIN, no reset, as when a laptop sleeps or leaves the network). They must not train on
            # for the kernel's ~15 minutes of retransmissions.
            left = workers_in(lab_name="pytest-addr", within_s=WORKERS_GONE_WITHIN_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
    assert not left, f"SSH workers still running {WORKERS_GONE_WITHIN_S:.0f} s after their launcher went silent: {left}"
    assert run.returncode == 1, err
    said = [line for line in err.splitlines() if line.startswith(("error:", "warning:"))]
    assert said == [f"error: the run's store address {bridge_address} is no longer this machine's "
                    "(Cannot assign requested address): an interface went down or its address changed mid-run"], err
    assert err.count("Exception raised from") <= 1, err  # torch's own warning for the call that was cut


WORKERS_GONE_WITHIN_S = 90.0
"""A hang detector, not a speed target: a worker keeps a silent store ~30 s (runtime/bootstrap.py)."""


def workers_in(lab_name: str, within_s: float) -> list[str]:
    """The worker processes still running in the lab's hosts' cgroups after waiting up to `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                cgroup = (proc / "cgroup").read_text()
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"/hppctl-lab-{lab_name}/" in cgroup and "hppctl.runtime.worker" in cmdline:
                found.append(f"{proc.name}: {cmdline.strip()}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1.0)
