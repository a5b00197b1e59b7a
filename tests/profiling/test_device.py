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


def _resident_spike(size: int) -> None:
    """Map `size` bytes of fresh memory, write every page (resident), and unmap them."""
    import mmap

    with mmap.mmap(-1, size) as block:
        block.write(b"\x01" * size)


def test_peak_rss_reset_and_read():
    # A 64 MiB peak well above what the process holds afterwards: the reset must bring the peak down
    # by most of it. (Comparing with a peak that was only the current RSS failed in a loaded suite run:
    # the process grew by 120 kB between the read and the reset.) The peak is reset first: in a whole
    # suite run, earlier tests left this process's peak far above anything the spike adds. The spike
    # is its own mapping: a malloc'd block can reuse heap pages already resident (after something set
    # M_MMAP_THRESHOLD, as hppctl/allocator.py does for any in-process `run`) and add nothing to the
    # peak (failed once so in a whole suite run, after the fuzz suite ran commands in-process).
    if not device.reset_peak_rss():  # a kernel without clear_refs: only the reading is checked
        current, peak = device.rss_bytes()
        assert 0 < current <= peak
        return
    _resident_spike(64 << 20)
    current, peak = device.rss_bytes()
    assert 0 < current and peak >= current + (48 << 20)
    assert device.reset_peak_rss()
    assert device.rss_bytes()[1] <= peak - (32 << 20)


@pytest.mark.lab
@pytest.mark.alone  # a busy process beside it takes CPU the 1-core quota would give
@pytest.mark.parametrize("period_us", [20_000, 100_000])
def test_a_one_core_quota_reads_as_one_core_whatever_its_period(period_us):
    """Measured in a real cgroup (needs root): two busy threads under a 1-core quota, after a pause.
    Over a 0.4 s window, 100 ms periods (the kernel's and docker's default) read 1.10-1.18 cores
    (a window that opens on an unspent budget gets part of it on top), and a 1-core device could get
    2 threads; the window now stretches to 2 s when the cores look limited."""
    import subprocess
    import sys

    from hppctl.lab import cgroups
    from tests.lab.conftest import lab_unavailable_reason

    reason = lab_unavailable_reason()
    if reason:
        pytest.skip(f"needs root and cgroups: {reason}")
    if device.affinity_cpus() < 2:
        pytest.skip("needs two CPUs (two busy threads against a 1-core quota)")
    hier = cgroups.detect()
    lab_dirs = cgroups.create_lab(hier, f"pytest-duty-{period_us}")
    try:
        host = [str(d) for d in cgroups.create_host(hier, lab_dirs, "h", 1.0, 1 << 30, period_us=period_us)]
        # idle first, as a probe waiting on its SSH session: the window then opens on an unspent budget
        code = "import time; time.sleep(0.15); from hppctl.profiling.device import duty_cycle; print(duty_cycle(2))"
        reads = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      preexec_fn=lambda: cgroups.enter(host)).stdout) for _ in range(4)]
    finally:
        cgroups.remove([str(d) for d in lab_dirs])
    assert all(0.9 <= r <= 1.1 for r in reads), reads
    assert {device.threads_for(r, 2) for r in reads} == {1}
