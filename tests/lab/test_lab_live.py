"""A real 3-host lab, measured as a user would (fabric over SSH). Needs root; see conftest.py.

One lab serves the whole module (built once, ~2 s); the last test takes it down and checks that
nothing is left. Budget: about a minute.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hppctl.lab import cgroups, measure
from hppctl.lab.manager import lab_down_leftovers
from hppctl.models.cluster import ClusterSpec
from hppctl.store import load
from tests.lab.conftest import free_subnet

pytestmark = pytest.mark.lab

NAME = "pytest-lab"
SPEC = f"""\
name: {NAME}
bandwidth: 100mbit
subnet: {{subnet}}
hosts:
  - {{name: fast, cpu: 1.0, memory: 1GB}}
  - {{name: slow, cpu: 0.25, memory: 256MB, bandwidth: 50mbit, delay: 5ms}}
  - {{name: nano, preset: jetson-nano}}
links:
  - {{between: [fast, nano], delay: 1ms}}
  - {{between: [nano, slow], bandwidth: 20mbit}}
"""
RATE_ABOVE = 0.10
"""The shaper is a cap: goodput may exceed the rate only by the measurement's own error."""
RATE_BELOW = 0.20
"""Below the rate: TCP/IP headers take ~4.5 % of it (1448 payload bytes of a 1514-byte frame), and the
sender, the receiver and the userspace delay line run under the hosts' CPU quotas on a shared machine; a
0.25-core sender through the delay line got 44.6 of 50 Mbit/s (89 %) on the slower cores of 2026-11-27
with the suite's other stream running beside it, and 37.0 (74 %) in a later suite (fast -> nano 78.5 of
100): these tests now run with nothing beside them (`alone`)."""


ATTEMPTS = 3
"""A shared machine can starve the probers for a whole measurement even with nothing of ours beside
them (CI of 2026-11-27: 15.6 of 20 Mbit/s, a 5 ms round trip's median 6.83 ms). The bounds load cannot
break (the shaper's cap, the delay as a floor) hold on every attempt; those it can (reaching the rate,
at most 1.5 ms over the delay) on the best of three, so a shaper set too tight still fails every time."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from tests.lab.conftest import built_lab

    with built_lab(tmp_path_factory, NAME, SPEC) as built:
        yield {"cluster": load(built.cluster_file, ClusterSpec), "state_dir": built.state_dir,
               "cluster_file": built.cluster_file, "subnet": built.subnet}


def lab_status(cli, lab) -> dict:
    code, out, err = cli("lab", "status", "--json", "--state-dir", lab["state_dir"])
    assert code == 0, err
    [report] = json.loads(out)["labs"]
    return report


def test_cluster_file_lists_hosts_with_ssh_section(lab):
    cluster = lab["cluster"]
    assert [d.name for d in cluster.devices] == ["fast", "slow", "nano"]
    prefix = lab["subnet"].rsplit(".", 1)[0]
    assert [d.host for d in cluster.devices] == [f"{prefix}.2", f"{prefix}.3", f"{prefix}.4"]
    assert all(d.user == "root" for d in cluster.devices)
    assert cluster.device("slow").memory == 256 * 10**6
    assert Path(cluster.ssh.known_hosts).exists() and Path(cluster.ssh.identity_file).exists()
    assert cluster.bandwidth_between("nano", "slow") == 20e6 / 8


def test_fabric_runs_a_command_on_each_host_as_a_user_would(lab, cli):
    import fabric
    import paramiko

    cluster = lab["cluster"]
    status = {h["name"]: h for h in lab_status(cli, lab)["hosts"]}
    hier = cgroups.detect()
    for device in cluster.devices:
        # Plain fabric, plus the two lines that keep host-key checking on.
        conn = fabric.Connection(device.host, user=device.user,
                                 connect_kwargs={"key_filename": cluster.ssh.identity_file})
        conn.client.load_host_keys(cluster.ssh.known_hosts)
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        result = conn.run("hostname; ip -4 -o addr show dev eth0; cat /proc/self/cgroup", hide=True, in_stream=False)
        conn.close()
        hostname, addr_line, *cgroup_lines = result.stdout.strip().splitlines()
        assert hostname == device.name
        assert f"inet {device.host}/24" in addr_line
        member = cgroups.membership("\n".join(cgroup_lines))
        for directory in status[device.name]["cgroups"]:
            for controller in ("cpu", "memory"):
                if Path(directory).is_relative_to(hier.roots[controller]):
                    key = controller if hier.version == 1 else ""
                    assert member[key] == cgroups.relative(hier, directory, controller), (device.name, member)


def test_unknown_host_key_is_refused(lab, tmp_path):
    import fabric
    import paramiko

    cluster = lab["cluster"]
    other = tmp_path / "known_hosts"
    other.write_text(Path(cluster.ssh.known_hosts).read_text().replace(cluster.devices[0].host,
                                                                          cluster.devices[0].host.rsplit(".", 1)[0] + ".250"))
    conn = fabric.Connection(cluster.devices[0].host, user="root",
                             connect_kwargs={"key_filename": cluster.ssh.identity_file})
    conn.client.load_host_keys(str(other))
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        conn.run("true", hide=True, in_stream=False)


@pytest.mark.alone  # sender and receiver run under the hosts' quotas: a test beside it took 21-26 % of the rate
@pytest.mark.parametrize("src, dst, mbit", [("fast", "nano", 100), ("slow", "fast", 50), ("nano", "slow", 20)])
def test_bandwidth_matches_configured_rate(lab, src, dst, mbit):
    rates = []
    for _ in range(ATTEMPTS):
        got = measure.bandwidth(lab["cluster"], src, dst, seconds=5.0)
        assert got["seconds"] >= 5.0 * 0.95
        rates.append(got["bytes_per_s"] * 8 / 1e6)
        # The cap holds on every attempt: a busy machine only slows a stream down.
        assert rates[-1] <= (1 + RATE_ABOVE) * mbit, f"{src}->{dst}: {rates[-1]:.1f} Mbit/s vs {mbit}"
        if rates[-1] >= (1 - RATE_BELOW) * mbit:
            break
    assert max(rates) >= (1 - RATE_BELOW) * mbit, f"{src}->{dst}: {[round(r, 1) for r in rates]} Mbit/s vs {mbit}"


@pytest.mark.alone  # the userspace delay line slows beside any CPU hog (8.0 ms for 5 in a trial with one)
@pytest.mark.parametrize("a, b, delay_ms", [("fast", "slow", 5.0), ("fast", "nano", 2.0), ("nano", "slow", 5.0)])
def test_configured_delay_shows_in_round_trip_time(lab, a, b, delay_ms):
    medians = []
    for _ in range(ATTEMPTS):
        got = measure.rtt(lab["cluster"], a, b, count=30)
        # Every round trip pays the configured delay, on every attempt: a busy machine only adds to it.
        assert got["min_s"] * 1e3 >= delay_ms, f"{a}<->{b}: fastest {got['min_s'] * 1e3:.2f} ms vs {delay_ms}"
        medians.append(got["median_s"] * 1e3)
        # The configured round trip, plus at most 1.5 ms of stack and delay-line overhead.
        if medians[-1] <= delay_ms + 1.5:
            break
    assert min(medians) <= delay_ms + 1.5, f"{a}<->{b}: medians {[round(m, 2) for m in medians]} ms vs {delay_ms}"


def test_delay_line_runs_under_the_labs_cpu_weight(lab):
    """Regression: in the root cgroup the delay line lost the CPU to other jobs (5 ms read 7.9 ms)."""
    state_dir = str(lab["state_dir"])
    lines = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path("/proc", pid, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "hppctl.lab.delayline" in cmdline and state_dir in cmdline:
            lines.append(Path("/proc", pid, "cgroup").read_text())
    assert lines, "no delay line of this lab is running"
    for text in lines:
        cpu = cgroups.membership(text).get("cpu") or cgroups.membership(text)[""]
        assert cpu.endswith(f"hppctl-lab-{NAME}/{cgroups.SERVICE_CGROUP}"), cpu


@pytest.mark.alone  # the fast host's wall/CPU must stay near 1: nothing else may compete for its core
def test_cpu_bound_work_slows_in_proportion_to_quota(lab):
    cluster, iterations = lab["cluster"], 5_000_000
    fast, slow = [], []
    for _ in range(3):  # interleaved, the best of each: robust to other load on this machine
        fast.append(measure.cpu_time(cluster, "fast", iterations))
        slow.append(measure.cpu_time(cluster, "slow", iterations))
    best_fast, best_slow = (min(runs, key=lambda r: r["seconds"]) for runs in (fast, slow))
    # The quota itself: the slow host gets ~1/4 of the wall clock as CPU, the fast one all of it.
    duty = best_slow["seconds"] / best_slow["cpu_seconds"]
    assert 3.2 <= duty <= 4.8, f"0.25-core host: wall/CPU {duty:.2f} (runs {slow})"
    assert best_fast["seconds"] / best_fast["cpu_seconds"] <= 1.3, fast
    # Wall against wall has no upper bound here: it also counts the machine's own speed, which moved
    # between the two hosts' runs on a shared 2-core VM (the same spin took 0.40 and 0.72 CPU s on
    # the fast host minutes apart, giving 7.2x), and the CPU a throttled process spends refilling
    # cold caches after each CFS period.
    ratio = best_slow["seconds"] / best_fast["seconds"]
    assert ratio >= 3.2, f"0.25 vs 1.0 core: only {ratio:.2f}x slower (fast {fast}, slow {slow})"


def test_allocating_beyond_the_limit_is_killed_and_reported(lab, cli):
    before = {h["name"]: h["oom_kills"] for h in lab_status(cli, lab)["hosts"]}
    got = measure.allocate(lab["cluster"], "slow", 600 * 10**6)
    assert got["killed"], got
    assert got["allocated_bytes"] <= 256 * 10**6
    after = {h["name"]: h for h in lab_status(cli, lab)["hosts"]}
    assert after["slow"]["oom_kills"] == before["slow"] + 1
    assert after["fast"]["oom_kills"] == before["fast"]
    assert after["slow"]["ssh_answers"]  # the host itself survives: only the hog was killed


def test_status_reports_limits_and_sshd(lab, cli):
    report = lab_status(cli, lab)
    assert report["complete"] and report["cgroup_version"] in (1, 2)
    hosts = {h["name"]: h for h in report["hosts"]}
    assert all(h["ssh_answers"] and h["sshd_running"] for h in hosts.values())
    assert hosts["slow"]["cpu_quota_cores"] == pytest.approx(0.25) and hosts["slow"]["cpu_period_s"] == pytest.approx(0.1)
    assert hosts["slow"]["memory_limit_bytes"] // 4096 == 256 * 10**6 // 4096
    assert hosts["nano"]["preset"] == "jetson-nano" and hosts["nano"]["cpu"] == pytest.approx(0.2791)


def _becomes(pid: int, stopped: bool, timeout_s: float = 10.0) -> bool:
    """Whether the process reaches the state (stopped or not) in time: a signal is delivered asynchronously."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        [state] = [line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("State:")]
        if (state == "T") == stopped:
            return True
        time.sleep(0.05)
    return False


def test_fault_freezes_resumes_and_kills_a_worker_and_cuts_a_link(lab, cli):
    import time

    from hppctl.lab import faults, sshd
    from hppctl.lab.manager import the_lab

    report = lab_status(cli, lab)
    where = ["--name", NAME, "--state-dir", lab["state_dir"]]
    code, _, err = cli("lab", "fault", "fast", "kill", *where)
    assert code == 1 and "fast: no hppctl worker is running there" in err
    code, _, err = cli("lab", "fault", "gone", "kill", *where)
    assert code == 2 and "has no host 'gone'" in err
    code, _, err = cli("lab", "fault", "fast", "explode", *where)
    assert code == 2 and "unknown action 'explode'" in err

    # A stand-in worker (a sleeping python whose command line names hppctl's worker module) and an
    # ordinary process beside it, both started over SSH as a launcher would start a worker.
    ssh = ["ssh", "-F", report["ssh_config"], "fast"]
    # The interpreter by its real path, as a launcher names it (the device's `python:`): `python3` on
    # PATH may be pyenv's shim, a shell script whose subshells carry the same command line and were
    # counted as a second worker (a flake: "too many values to unpack").
    python = shlex.quote(os.path.realpath(sys.executable))
    worker = subprocess.Popen([*ssh, f"{python} -c 'import time; time.sleep(120)' -m hppctl.runtime.worker"])
    bystander = subprocess.Popen([*ssh, "sleep 120"])
    try:
        host = faults.find_host(the_lab(lab["state_dir"], NAME), "fast")
        deadline = time.monotonic() + 30
        while not (pids := faults.worker_pids(host)) and time.monotonic() < deadline:
            time.sleep(0.1)
        [pid] = pids
        # several hosts are checked before any is hurt: one without a worker, or named twice, hurts none
        code, _, err = cli("lab", "fault", "fast,slow", "stop", *where)
        assert code == 1 and "slow: no hppctl worker is running there" in err and not _becomes(pid, True, timeout_s=0.5)
        code, _, err = cli("lab", "fault", "fast,fast", "stop", *where)
        assert code == 2 and "named twice" in err
        for action, stopped in (("stop", True), ("cont", False)):
            code, out, err = cli("lab", "fault", "fast", action, "--json", *where)
            assert code == 0, err
            assert json.loads(out) == {"host": "fast", "action": action, "pids": [pid]}
            assert _becomes(pid, stopped), action
        # term: what a worker takes as "leave gracefully" (the stand-in just ends); kill as in the
        # recovery lab tests, which send it through the same code
        code, _, err = cli("lab", "fault", "fast", "term", *where)
        assert code == 0 and f"fast: SIGTERM to worker pid {pid}" in err
        worker.wait(timeout=30)
        assert bystander.poll() is None  # only the worker: the host's other processes go on

        addresses = [next(h["address"] for h in report["hosts"] if h["name"] == n) for n in ("fast", "slow")]
        code, out, _ = cli("lab", "fault", "fast,slow", "link-down", "--json", *where)  # together
        assert code == 0 and [f["host"] for f in json.loads(out)] == ["fast", "slow"]
        assert not any(sshd.banner(address, timeout_s=1.0) for address in addresses)
        assert cli("lab", "fault", "fast,slow", "link-up", *where)[0] == 0
        deadline = time.monotonic() + 10
        while not all(sshd.banner(a, timeout_s=1.0) for a in addresses) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(sshd.banner(address, timeout_s=1.0) for address in addresses)
    finally:
        cli("lab", "fault", "fast,slow", "link-up", *where)
        for proc in (worker, bystander):
            proc.kill()
            proc.wait()


def test_crashed_up_is_cleaned_by_down(tmp_path, monkeypatch, lab):
    """An `up` that dies after making namespaces and cgroups (here: sshd fails, and the rollback is
    disabled to mimic a kill -9) leaves a state record; `down` removes it all, and so does the
    prefix sweep when even the state is lost."""
    from hppctl.cli import run
    from hppctl.lab import manager, sshd

    spec = tmp_path / "crash.yaml"
    spec.write_text(f"name: pytest-crash\nsubnet: {free_subnet()}\nhosts:\n  - {{name: a, cpu: 0.5, memory: 100MB}}\n")

    def die(*args, **kwargs):
        raise RuntimeError("simulated crash")

    for lose_state in (False, True):
        with monkeypatch.context() as m:
            m.setattr(sshd, "start", die)
            m.setattr(manager, "down_state", lambda state: [])
            with pytest.raises(RuntimeError):
                run(["lab", "up", "--spec", str(spec), "--state-dir", str(tmp_path / "state")])
        assert lab_down_leftovers("pytest-crash"), "the simulated crash should leave resources behind"
        if lose_state:
            subprocess.run(["rm", "-rf", str(tmp_path / "state")], check=True)
        assert run(["lab", "down", "--name", "pytest-crash", "--state-dir", str(tmp_path / "state")]) == 0
        assert lab_down_leftovers("pytest-crash") == []


def test_down_removes_everything_and_is_idempotent(lab, cli):
    code, _, err = cli("lab", "down", "--name", NAME, "--state-dir", lab["state_dir"])
    assert code == 0, err
    assert lab_down_leftovers(NAME) == []
    tag = __import__("hppctl.lab.layout", fromlist=["lab_tag"]).lab_tag(NAME)
    assert NAME not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    hier = cgroups.detect()
    for root in hier.unique_roots():
        assert not list(root.rglob(f"hppctl-lab-{NAME}")), root
    assert not Path(lab["state_dir"], NAME).exists()
    code, _, err = cli("lab", "down", "--name", NAME, "--state-dir", lab["state_dir"])
    assert code == 0, err
