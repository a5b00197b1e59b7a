"""device.py: cgroup v1/v2 quotas and limits from a fake /proc and cgroup tree, threads, meminfo."""

import pytest

from hppctl.profiling import device

V1_MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
22 1 8:1 / / rw - ext4 /dev/sda1 rw
"""
V2_MOUNTINFO = "40 25 0:35 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def fake_proc(tmp_path, mountinfo: str, cgroup: str):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(mountinfo.replace("/sys/fs/cgroup", str(tmp_path / "cg")))
    (proc / "cgroup").write_text(cgroup)
    return proc


def write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v1_quota_and_limit_take_the_smallest_along_the_path(tmp_path):
    proc = fake_proc(tmp_path, V1_MOUNTINFO, "4:memory:/lab/h3\n1:cpu:/lab/h3\n0::/\n")
    cpu, mem = tmp_path / "cg" / "cpu", tmp_path / "cg" / "memory"
    write(cpu / "lab" / "h3" / "cpu.cfs_quota_us", "5000\n")
    write(cpu / "lab" / "h3" / "cpu.cfs_period_us", "20000\n")
    write(cpu / "lab" / "cpu.cfs_quota_us", "-1\n")
    write(cpu / "lab" / "cpu.cfs_period_us", "100000\n")
    write(mem / "lab" / "h3" / "memory.limit_in_bytes", "268435456\n")
    write(mem / "memory.limit_in_bytes", "9223372036854771712\n")  # "unlimited"
    limits = device.cgroup_limits(proc)
    assert limits["cpu_quota_cores"] == 0.25 and limits["memory_limit_bytes"] == 268435456
    assert limits["cgroup"] == "v1" and not limits["hidden"]
    assert device.cpu_quota(2, limits) == (0.25, "cgroup v1")


def test_v2_cpu_max_and_memory_max(tmp_path):
    proc = fake_proc(tmp_path, V2_MOUNTINFO, "0::/lab/h1\n")
    root = tmp_path / "cg"
    write(root / "lab" / "h1" / "cpu.max", "150000 100000\n")
    write(root / "lab" / "cpu.max", "max 100000\n")
    write(root / "lab" / "h1" / "memory.max", "max\n")
    write(root / "lab" / "memory.max", "1073741824\n")
    limits = device.cgroup_limits(proc)
    assert limits == {"cpu_quota_cores": 1.5, "memory_limit_bytes": 1073741824, "cgroup": "v2", "hidden": False}
    assert device.threads_for(1.5, 4) == 2


def test_unlimited_root_cgroup_is_not_measured(tmp_path):
    proc = fake_proc(tmp_path, V1_MOUNTINFO, "4:memory:/\n1:cpu:/\n")
    limits = device.cgroup_limits(proc)
    assert limits["cpu_quota_cores"] is None and not limits["hidden"]
    assert device.cpu_quota(2, limits) == (None, "none")


def test_hidden_cgroup_falls_back_to_the_duty_cycle(tmp_path, monkeypatch):
    # ip netns exec remounts /sys: no cgroup mount is visible, but the process is in a child cgroup
    proc = fake_proc(tmp_path, "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", "1:cpu:/hppctl-lab-x/h3\n0::/\n")
    limits = device.cgroup_limits(proc)
    assert limits["hidden"] and limits["cgroup"] is None
    monkeypatch.setattr(device, "duty_cycle", lambda threads, seconds=0.4: 0.26)
    assert device.cpu_quota(2, limits) == (0.26, "measured duty cycle (2 busy threads)")
    monkeypatch.setattr(device, "duty_cycle", lambda threads, seconds=0.4: 1.95)
    assert device.cpu_quota(2, limits) == (None, "none (duty cycle of all CPUs)")


@pytest.mark.parametrize("quota, cpus, threads", [(None, 4, 4), (0.25, 4, 1), (1.0, 4, 1), (1.01, 4, 1),
                                                  (1.04, 4, 1), (1.09, 4, 1), (1.2, 4, 2), (1.5, 4, 2),
                                                  (3.0, 2, 2), (0.05, 1, 1)])
def test_threads_follow_the_quota(quota, cpus, threads):
    assert device.threads_for(quota, cpus) == threads


def test_meminfo_in_bytes():
    info = device.meminfo("MemTotal:       16384 kB\nMemAvailable:    8192 kB\nHugePages_Total:       0\n")
    assert info == {"MemTotal": 16384 * 1024, "MemAvailable": 8192 * 1024, "HugePages_Total": 0}


def test_duty_cycle_of_one_thread_is_at_most_one_core():
    assert 0.0 < device.duty_cycle(1, seconds=0.05) <= 1.1


def test_identify_reports_everything_the_fingerprint_needs():
    ident = device.identify(measure_quota=False)
    from hppctl.profiling.records import Identity

    Identity.model_validate(ident)
    assert ident["hppctl"] and ident["threads"] >= 1


def test_peak_rss_reset_and_read():
    current, peak = device.rss_bytes()
    assert 0 < current <= peak
    if device.reset_peak_rss():
        assert device.rss_bytes()[1] <= peak
