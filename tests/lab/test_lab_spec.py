"""The lab without root: spec validation through the CLI, presets, layout, shaping rules, cgroup files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from hppctl.errors import BadInput
from hppctl.lab import cgroups, delayline, shaping
from hppctl.lab.layout import Impairment, cluster_for, lab_tag, plan_lab, veth_name
from hppctl.lab.presets import PRESETS, cfs_quota, preset_cpu, preset_memory
from hppctl.models.cluster import ClusterSpec
from hppctl.models.lab import LabSpec
from hppctl.store import dumps

GOOD = """\
name: env-d
bandwidth: 100mbit
hosts:
  - {name: tx0,  preset: jetson-tx2}
  - {name: nano0, preset: jetson-nano}
  - {name: nano1, cpu: 0.25, memory: 1GB, bandwidth: 50mbit, delay: 2ms}
links:
  - {between: [tx0, nano0], bandwidth: 20mbit, delay: 1ms}
"""


def write(tmp_path: Path, text: str, name: str = "L.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, expected", [
    ("name: x\nhosts: [ {name: a, cpu: 1\n", ["L.yaml", "malformed YAML", "line"]),
    (GOOD.replace("cpu: 0.25", "cpu: -1"), ["L.yaml", "hosts.2.cpu", "-1"]),
    (GOOD.replace("preset: jetson-tx2", "preset: jetson-agx-thor"), ["L.yaml", "hosts.0.preset", "jetson-agx-thor"]),
    (GOOD.replace("bandwidth: 50mbit", "bandwidth: 50 furlongs"), ["L.yaml", "hosts.2.bandwidth", "50 furlongs"]),
    (GOOD.replace("bandwidth: 100mbit", "bandwidth: fast"), ["L.yaml", "bandwidth", "fast"]),
    (GOOD.replace("delay: 2ms", "delay: -2ms"), ["L.yaml", "hosts.2.delay", "-2ms"]),
    (GOOD + "subnet: 8.8.8.0/24\n", ["L.yaml", "subnet", "not private"]),
    (GOOD.replace("{name: nano1, cpu: 0.25,", "{name: nano1, cpux: 0.25,"), ["L.yaml", "hosts.2", "cpux"]),
    (GOOD.replace("[tx0, nano0]", "[tx0, ghost]"), ["L.yaml", "ghost"]),
    (GOOD + "cpu_period: 2s\n", ["L.yaml", "cpu_period", "2s"]),
    (GOOD + "cpu_period: 0\n", ["L.yaml", "cpu_period", "0"]),
])
def test_bad_spec_exits_2_with_one_line_naming_file_field_value(cli, tmp_path, text, expected):
    code, out, err = cli("lab", "up", "--spec", write(tmp_path, text), "--state-dir", tmp_path / "state")
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in expected:
        assert word in lines[0], (word, lines[0])
    assert not (tmp_path / "state").exists()


def test_missing_spec_file_exits_2(cli, tmp_path):
    code, _, err = cli("lab", "up", "--spec", tmp_path / "nope.yaml")
    assert code == 2 and "nope.yaml" in err and "no such file" in err


def test_without_root_exits_2_saying_so(cli, tmp_path, monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    code, _, err = cli("lab", "up", "--spec", write(tmp_path, GOOD), "--state-dir", tmp_path / "state")
    assert code == 2
    assert "root" in err and "sudo" in err and len(err.strip().splitlines()) == 1, err


def test_missing_tools_are_named_with_their_package(cli, tmp_path, monkeypatch):
    import hppctl.lab.system as system

    real = system.which
    monkeypatch.setattr(system, "which", lambda cmd: None if cmd in ("sshd", "tc") else real(cmd))
    monkeypatch.setattr("os.geteuid", lambda: 0)
    code, _, err = cli("lab", "up", "--spec", write(tmp_path, GOOD), "--state-dir", tmp_path / "state")
    assert code == 2, err
    line = err.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: hppctl lab up needs"), line
    assert "sshd" in line and "tc" in line and "apt-get install iproute2 openssh-server" in line


def test_cpu_beyond_this_machine_is_bad_input(tmp_path):
    spec = LabSpec.model_validate({"name": "x", "hosts": [{"name": "a", "cpu": 999, "memory": "1GB"}]})
    with pytest.raises(Exception) as e:
        plan_lab(spec, cores=2, source="L.yaml")
    assert "L.yaml: hosts.0.cpu: 999 cores" in str(e.value)


def test_presets_follow_flops_ratios_and_scaled_memory():
    assert preset_cpu("jetson-nx", 1.0, cores=2) == 1.0  # the fastest gets `fastest_cpu`
    for name, preset in PRESETS.items():
        expected = preset.peak_gflops_fp32 / PRESETS["jetson-nx"].peak_gflops_fp32
        assert preset_cpu(name, 1.0, cores=2) == pytest.approx(expected, abs=1e-4)
    assert preset_cpu("jetson-nx", 8.0, cores=2) == 2.0  # never more than this machine has
    assert preset_memory("jetson-nano") == 2**30 and preset_memory("jetson-tx2", 0.5) == 4 * 2**30


def test_cfs_quota_respects_the_kernel_minimum():
    assert cfs_quota(0.25) == (25000, 100000)
    assert cfs_quota(1.0) == (100000, 100000)
    assert cfs_quota(0.25, 20_000) == (5000, 20000)  # the spec's `cpu_period: 20ms`
    quota, period = cfs_quota(0.005)
    assert quota == 1000 and quota / period == pytest.approx(0.005)
    assert cfs_quota(0.02, 20_000) == (1000, 50000)


def test_layout_addresses_rates_impairments_and_cluster_file():
    spec = LabSpec.model_validate_json(__import__("json").dumps(__import__("yaml").safe_load(GOOD)))
    plan = plan_lab(spec, cores=2)
    assert [h.address for h in plan.hosts] == ["10.213.0.2", "10.213.0.3", "10.213.0.4"]
    assert plan.bridge_address == "10.213.0.1" and plan.bridge == f"hpb{lab_tag('env-d')}"
    assert len(veth_name(plan.tag, 999)) <= 15
    assert plan.rate("tx0", "nano0") == 20e6 / 8 and plan.rate("tx0", "nano1") == 100e6 / 8
    assert plan.rate("nano1", "tx0") == 50e6 / 8
    assert plan.egress_overrides("tx0") == [("10.213.0.3", 20e6 / 8)]
    # Delay applies where packets arrive: the host's own, or the link's for that pair.
    assert plan.impairment("tx0", "nano1") == Impairment(0.002, 0)
    assert plan.impairment("nano0", "tx0") == Impairment(0.001, 0)
    default, overrides = plan.ingress_rules("tx0")
    assert default == Impairment() and overrides == [("10.213.0.3", Impairment(0.001, 0))]
    cluster = cluster_for(plan, "/s/known_hosts", "/s/id", "/usr/bin/python3")
    again = ClusterSpec.model_validate(__import__("yaml").safe_load(dumps(cluster, "yaml")))
    assert again == cluster
    assert cluster.device("nano1").host == "10.213.0.4" and cluster.device("nano1").user == "root"
    assert cluster.device("nano1").memory == 10**9
    assert cluster.ssh.known_hosts == "/s/known_hosts" and cluster.ssh.identity_file == "/s/id"
    assert cluster.bandwidth_between("tx0", "nano0") == 20e6 / 8
    assert cluster.bandwidth_between("nano0", "nano1") == 50e6 / 8  # the slower direction
    assert cluster.bandwidth_between("tx0", "tx0") == 100e6 / 8


def test_egress_commands_cap_default_and_override_classes():
    cmds = shaping.egress_commands("eth0", 12.5e6, [("10.213.0.3", 2.5e6)])
    text = [" ".join(c) for c in cmds]
    assert text[0] == "tc qdisc replace dev eth0 root handle 1: htb default 1"
    assert "classid 1:1 htb rate 100000000bit ceil 100000000bit" in text[1]
    assert "classid 1:2 htb rate 20000000bit ceil 20000000bit" in text[2]
    assert text[3].endswith("u32 match ip dst 10.213.0.3/32 flowid 1:2")


def test_netem_commands_only_when_something_is_impaired():
    assert shaping.netem_ingress_commands("v", Impairment(), []) == []
    text = [" ".join(c) for c in shaping.netem_ingress_commands("v", Impairment(0.005, 1.0), [("10.0.0.9", Impairment())])]
    assert any("parent 1:1 handle 10: netem limit 100000 delay 5000us loss 1%" in t for t in text)
    assert text[-1].endswith("u32 match ip src 10.0.0.9/32 flowid 1:2")


def test_nfqueue_plan_one_queue_per_distinct_impairment():
    rules, queues = shaping.nfqueue_plan("10.213.0.0/24", Impairment(0.005, 0),
                                         [("10.213.0.3", Impairment()), ("10.213.0.4", Impairment(0.001, 10))])
    assert rules[0] == ["-i", "lo", "-j", "ACCEPT"]
    assert rules[1] == ["-s", "10.213.0.3/32", "-j", "ACCEPT"]
    assert rules[2] == ["-s", "10.213.0.4/32", "-j", "NFQUEUE", "--queue-num", "0"]
    assert rules[3] == ["-s", "10.213.0.0/24", "-j", "NFQUEUE", "--queue-num", "1"]
    assert [delayline.QueueRule.parse(q) for q in queues] == [
        delayline.QueueRule(0, 0.001, 0.1), delayline.QueueRule(1, 0.005, 0.0)]
    assert shaping.nfqueue_plan("10.213.0.0/24", Impairment(), []) == ([], [])


def test_delayline_messages_round_trip():
    verdict = delayline.verdict_message(3, 77, delayline.NF_ACCEPT, batch=True)
    [(kind, queue, attrs)] = list(delayline.parse_messages(verdict))
    assert (kind, queue) == (delayline.NFQNL_MSG_VERDICT_BATCH, 3)
    assert struct.unpack("!II", attrs[delayline.NFQA_VERDICT_HDR]) == (delayline.NF_ACCEPT, 77)
    assert len(delayline.config_messages(5)) == 4


MOUNTINFO_V1 = """\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
33 30 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
38 30 0:34 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
"""


def test_detect_prefers_v1_controllers_on_hybrid_systems():
    hier = cgroups.detect(MOUNTINFO_V1)
    assert hier.version == 1
    assert hier.roots == {"cpu": Path("/sys/fs/cgroup/cpu,cpuacct"), "memory": Path("/sys/fs/cgroup/memory")}


def test_v2_limits_are_written_and_read_back(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.subtree_control").write_text("cpu memory")
    hier = cgroups.Hierarchy(2, {"cpu": root, "memory": root})
    lab_dirs = cgroups.lab_dirs(hier, "x")
    lab_dirs[0].mkdir()
    (lab_dirs[0] / "cgroup.subtree_control").write_text("cpu memory")
    [host] = cgroups.create_host(hier, lab_dirs, "h", 0.25, 256 * 2**20)
    assert (host / "cpu.max").read_text() == "25000 100000\n"
    assert (host / "memory.max").read_text() == f"{256 * 2**20}\n"
    (host / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (host / "memory.current").write_text("1234\n")
    (host / "cgroup.procs").write_text("")
    stats = cgroups.stats([str(host)])
    assert stats["oom_kills"] == 1 and stats["memory_used_bytes"] == 1234 and stats["cpu_quota_cores"] == 0.25
    assert stats["cpu_period_s"] == 0.1


def test_v1_limits_go_to_the_right_hierarchy(tmp_path):
    cpu_root, mem_root = tmp_path / "cpu", tmp_path / "memory"
    cpu_root.mkdir(), mem_root.mkdir()
    hier = cgroups.Hierarchy(1, {"cpu": cpu_root, "memory": mem_root})
    lab_dirs = cgroups.lab_dirs(hier, "x")
    for d in lab_dirs:
        d.mkdir()
    cpu_dir, mem_dir = cgroups.create_host(hier, lab_dirs, "h", 0.5, 10**9, period_us=20_000)
    assert (cpu_dir / "cpu.cfs_quota_us").read_text() == "10000\n"
    assert (cpu_dir / "cpu.cfs_period_us").read_text() == "20000\n"
    assert not (cpu_dir / "memory.limit_in_bytes").exists()
    assert (mem_dir / "memory.limit_in_bytes").read_text() == "1000000000\n"
    (mem_dir / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cgroups.stats([str(cpu_dir), str(mem_dir)])["oom_kills"] == 2


def test_membership_parses_proc_cgroup():
    text = "4:memory:/hppctl-lab-x/h\n1:cpu,cpuacct:/hppctl-lab-x/h\n0::/\n"
    assert cgroups.membership(text) == {"memory": "/hppctl-lab-x/h", "cpu": "/hppctl-lab-x/h",
                                        "cpuacct": "/hppctl-lab-x/h", "": "/"}


def test_subnet_overlap_parsing():
    from hppctl.lab.network import route_destinations

    lines = ["default via 192.0.2.1 dev eth0", "192.0.2.0/24 dev eth0 proto kernel scope link",
             "local 127.0.0.1 dev lo table local", "broadcast 127.255.255.255 dev lo table local"]
    found = [str(net) for net, _ in route_destinations(lines)]
    assert found == ["192.0.2.0/24", "127.0.0.1/32", "127.255.255.255/32"]


def test_free_subnet_skips_every_subnet_a_route_overlaps(monkeypatch):
    """Regression: the suite's labs had fixed subnets and failed in CI when a benchmark's lab held one."""
    import subprocess

    from hppctl.lab import network

    routes = "10.213.100.0/24 dev hpb1 proto kernel\n10.213.101.7 dev hpb2\n10.213.96.0/20 dev vpn0\n"
    monkeypatch.setattr(network, "sh", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, routes, ""))
    assert network.free_subnet() == "10.213.112.0/24"  # the /20 covers 96-111
    assert network.free_subnet(first=90) == "10.213.90.0/24"
    monkeypatch.setattr(network, "sh", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "10.213.0.0/16 dev x\n", ""))
    with pytest.raises(BadInput, match="no free /24"):
        network.free_subnet()


# --- `hppctl lab fault` without a lab: which processes count as workers, which lab and host ------------


@pytest.mark.parametrize("argv, expected", [
    (["/usr/bin/python3", "-m", "hppctl.runtime.worker"], True),
    (["env", "python3", "-m", "hppctl.runtime.galaxy.worker"], True),
    (["python3", "-m", "hppctl.runtime.psl.worker", "--x"], True),
    (["bash", "-c", "python3 -m hppctl.runtime.worker"], False),  # the shell that started it
    (["python3", "-m", "hppctl.profiling.probe", "train"], False),
    (["sshd: root@notty"], False),
    ([], False),
])
def test_a_worker_is_a_process_running_a_worker_module(argv, expected):
    from hppctl.lab.faults import is_worker

    assert is_worker(argv) is expected


def _state(tmp_path: Path, name: str):
    from hppctl.lab.manager import Recorder
    from hppctl.models.lab import HostState, LabState

    host = HostState(name="a", address="10.0.0.2", netns="hppctl-x-a", veth="hl-x-0", cpu=1.0,
                     memory_bytes=10**9, bandwidth_bytes_per_s=1e7, cgroups=[str(tmp_path / name / "cg")])
    (tmp_path / name).mkdir()
    return Recorder(LabState(name=name, tag="abcdef", state_dir=str(tmp_path / name), subnet="10.0.0.0/24",
                             hosts=[host], complete=True)).state


def test_fault_names_the_lab_host_and_action_it_cannot_use(tmp_path):
    from hppctl.errors import RuntimeFailure
    from hppctl.lab.faults import Fault, inject
    from hppctl.lab.manager import the_lab

    with pytest.raises(BadInput, match="no lab is up"):
        the_lab(tmp_path)
    state = _state(tmp_path, "one")
    assert the_lab(tmp_path).name == "one"
    with pytest.raises(BadInput, match="no lab named 'two'"):
        the_lab(tmp_path, "two")
    _state(tmp_path, "two")
    with pytest.raises(BadInput, match=r"several labs are up \(one, two\)"):
        the_lab(tmp_path)
    assert the_lab(tmp_path, "two").name == "two"
    with pytest.raises(BadInput, match=r"lab 'one' has no host 'b' \(hosts: a\)"):
        inject(state, "b", "kill")
    with pytest.raises(BadInput, match="unknown action 'crash'"):
        inject(state, "a", "crash")
    with pytest.raises(RuntimeFailure, match="a: no hppctl worker is running there"):
        inject(state, "a", "stop")  # its cgroup holds no process
    assert Fault("a", "kill", (12, 13)).describe() == "a: SIGKILL to worker pids 12, 13"
    assert Fault("a", "link-down").describe() == "a: eth0 down"
