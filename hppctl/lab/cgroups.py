"""A cgroup per lab host: CPU quota and memory limit, on cgroup v1 or v2.

Layout: `<hierarchy>/<parent>/hppctl-lab-<lab>/<host>`, where `parent` defaults to the
hierarchy's root (on v2 only the root may hold processes *and* hand controllers to children, so
that is where a fresh subtree can always be made). On v1 the same directory is made in the cpu
and in the memory hierarchy. A host's sshd is started inside its cgroup, so every process a user
starts over SSH on that host inherits the limits.

- v2: cpu.max = "quota period", memory.max = limit, memory.swap.max = 0; OOM kills are counted
  in memory.events (`oom_kill`).
- v1: cpu.cfs_period_us / cpu.cfs_quota_us, memory.limit_in_bytes (and memory.memsw.limit_in_bytes
  = the same where swap accounting exists, i.e. no swap); OOM kills in memory.oom_control.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from hppctl.errors import BadInput
from hppctl.lab.layout import CGROUP_PREFIX, cgroup_lab_dir_name
from hppctl.lab.presets import CFS_PERIOD_US, cfs_quota
from hppctl.lab.system import LabCommandFailed

CONTROLLERS = ("cpu", "memory")


@dataclass(frozen=True)
class Hierarchy:
    """Where the cpu and memory controllers are mounted: one v2 root, or one v1 mount each."""

    version: int
    roots: dict[str, Path]
    """controller -> mount point (on v2 both controllers map to the same root)."""

    def unique_roots(self) -> list[Path]:
        return sorted(set(self.roots.values()))


def parse_mountinfo(text: str) -> tuple[list[Path], dict[str, Path]]:
    """(cgroup2 mount points, v1 controller -> mount point) from /proc/self/mountinfo."""
    v2, v1 = [], {}
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount_point, fstype, options = Path(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup2":
            v2.append(mount_point)
        elif fstype == "cgroup":
            for controller in CONTROLLERS:
                if controller in options:
                    v1[controller] = mount_point
    return v2, v1


def detect(mountinfo: str | None = None) -> Hierarchy:
    """v1 when both controllers have v1 mounts (hybrid systems keep them there), else v2 if it has them."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    v2_mounts, v1 = parse_mountinfo(text)
    if all(c in v1 for c in CONTROLLERS):
        return Hierarchy(1, {c: v1[c] for c in CONTROLLERS})
    for root in v2_mounts:
        available = (root / "cgroup.controllers").read_text().split() if (root / "cgroup.controllers").exists() else []
        if all(c in available for c in CONTROLLERS):
            return Hierarchy(2, {c: root for c in CONTROLLERS})
    raise BadInput("the lab needs the cpu and memory cgroup controllers (cgroup v1 or v2), and this "
                   "machine mounts neither: mount cgroup2 on /sys/fs/cgroup (or v1 cpu and memory)")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise LabCommandFailed(f"cannot write {value.strip()!r} to {path}: {e.strerror}") from None


def _enable_controllers(directory: Path) -> None:
    """v2: let `directory`'s children use cpu and memory (no-op when already enabled)."""
    enabled = (directory / "cgroup.subtree_control").read_text().split()
    wanted = [c for c in CONTROLLERS if c not in enabled]
    if not wanted:
        return
    try:
        (directory / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
    except OSError as e:
        hint = (" (it holds processes itself: cgroup v2 only hands controllers to children of a cgroup "
                "without processes; use --cgroup-parent to pick one)" if e.errno == errno.EBUSY else "")
        raise BadInput(f"cannot enable {', '.join(wanted)} in {directory}: {e.strerror}{hint}") from None


def lab_dirs(hier: Hierarchy, lab: str, parent: str = "") -> list[Path]:
    """The lab's directory in each hierarchy (one on v2, one per controller on v1)."""
    return [root / parent.strip("/") / cgroup_lab_dir_name(lab) for root in hier.unique_roots()]


LAB_CPU_SHARES_V1 = 102_400  # 100x the default 1024
LAB_CPU_WEIGHT_V2 = 10_000   # the maximum (default 100)


def create_lab(hier: Hierarchy, lab: str, parent: str = "") -> list[Path]:
    """The lab's cgroup, with a high CPU weight.

    Why the weight: a host's quota is a ceiling, but on a busy machine a 1-core host would get less
    than its core and the devices' speed ratios would drift with unrelated load. The weight lets
    the lab win contention; the quotas still cap what it can take in total.
    """
    dirs = lab_dirs(hier, lab, parent)
    for d in dirs:
        if hier.version == 2:
            _enable_controllers(d.parent)
        d.mkdir(parents=False, exist_ok=True)
        if hier.version == 2:
            _enable_controllers(d)
            _write(d / "cpu.weight", f"{LAB_CPU_WEIGHT_V2}\n")
        elif d.is_relative_to(hier.roots["cpu"]):
            _write(d / "cpu.shares", f"{LAB_CPU_SHARES_V1}\n")
    return dirs


def create_host(hier: Hierarchy, lab_dir_paths: list[Path], host: str, cpu: float, memory_bytes: int,
                period_us: int = CFS_PERIOD_US) -> list[Path]:
    """Make the host's cgroup(s) under the lab's and set its CPU quota (per `period_us`) and memory limit."""
    quota, period = cfs_quota(cpu, period_us)
    dirs = []
    for lab_dir in lab_dir_paths:
        d = lab_dir / host
        d.mkdir(exist_ok=True)
        dirs.append(d)
        if hier.version == 2:
            _write(d / "cpu.max", f"{quota} {period}\n")
            _write(d / "memory.max", f"{memory_bytes}\n")
            if (d / "memory.swap.max").exists():  # absent when the kernel has no swap accounting
                _write(d / "memory.swap.max", "0\n")
            continue
        serves = {c for c, root in hier.roots.items() if lab_dir.is_relative_to(root)}
        if "cpu" in serves:
            _write(d / "cpu.cfs_period_us", f"{period}\n")
            _write(d / "cpu.cfs_quota_us", f"{quota}\n")
        if "memory" in serves:
            _write(d / "memory.limit_in_bytes", f"{memory_bytes}\n")
            if (d / "memory.memsw.limit_in_bytes").exists():  # memory+swap: no swapping past the limit
                _write(d / "memory.memsw.limit_in_bytes", f"{memory_bytes}\n")
            if (d / "memory.swappiness").exists():
                _write(d / "memory.swappiness", "0\n")
    return dirs


SERVICE_CGROUP = "_net"  # host names cannot start with "_"


def create_service(lab_dir_paths: list[Path]) -> list[Path]:
    """A leaf cgroup under the lab's, without quota, for the lab's own network helpers (the delay line).

    Why: the delay line is on the path of every delayed packet; in the root cgroup it competes with
    every job on the machine, and on a loaded machine a 5 ms delay read 7.9 ms. Under the lab's
    cgroup it shares the lab's high CPU weight. A leaf, because cgroup v2 allows no process in a
    cgroup whose controllers are enabled for children."""
    dirs = []
    for lab_dir in lab_dir_paths:
        d = lab_dir / SERVICE_CGROUP
        d.mkdir(exist_ok=True)
        dirs.append(d)
    return dirs


def enter(dirs: list[str]) -> None:
    """Move the calling process into `dirs` (used between fork and exec: children inherit it)."""
    for d in dirs:
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def _read_int_field(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == key:
                return int(words[1])
    except OSError:
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def procs(dirs: list[str]) -> list[int]:
    found: set[int] = set()
    for d in dirs:
        try:
            found.update(int(p) for p in Path(d, "cgroup.procs").read_text().split())
        except OSError:
            continue
    return sorted(found)


def stats(dirs: list[str]) -> dict:
    """Memory use, limit, peak and OOM kills of a host's cgroup, and its CPU quota in cores."""
    out = {"memory_used_bytes": None, "memory_peak_bytes": None, "memory_limit_bytes": None,
           "oom_kills": None, "cpu_quota_cores": None, "cpu_period_s": None, "processes": len(procs(dirs))}
    for d in map(Path, dirs):
        if (d / "memory.events").exists():  # v2
            out["memory_used_bytes"] = _read_int(d / "memory.current")
            out["memory_peak_bytes"] = _read_int(d / "memory.peak")
            out["memory_limit_bytes"] = _read_int(d / "memory.max")
            out["oom_kills"] = _read_int_field(d / "memory.events", "oom_kill")
        elif (d / "memory.oom_control").exists():  # v1
            out["memory_used_bytes"] = _read_int(d / "memory.usage_in_bytes")
            out["memory_peak_bytes"] = _read_int(d / "memory.max_usage_in_bytes")
            out["memory_limit_bytes"] = _read_int(d / "memory.limit_in_bytes")
            out["oom_kills"] = _read_int_field(d / "memory.oom_control", "oom_kill")
        if (d / "cpu.max").exists():
            quota, _, period = (d / "cpu.max").read_text().partition(" ")
            out["cpu_quota_cores"] = None if quota == "max" else int(quota) / int(period)
            out["cpu_period_s"] = int(period) / 1e6
        elif (d / "cpu.cfs_quota_us").exists():
            quota, period = _read_int(d / "cpu.cfs_quota_us"), _read_int(d / "cpu.cfs_period_us")
            out["cpu_quota_cores"] = None if quota is None or quota < 0 else quota / period
            out["cpu_period_s"] = None if period is None else period / 1e6
    return out


def kill_all(dirs: list[str], timeout_s: float = 5.0) -> None:
    """SIGKILL every process in the cgroups and wait until they are gone (v2: cgroup.kill if present)."""
    deadline = time.monotonic() + timeout_s
    while (pids := procs(dirs)) and time.monotonic() < deadline:
        kill_file = Path(dirs[0], "cgroup.kill")
        if kill_file.exists():
            _try_write(kill_file, "1")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _try_write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass


def remove(dirs: list[str]) -> None:
    """Remove cgroup directories (children first); missing ones are fine, so this is idempotent."""
    for d in sorted(map(Path, dirs), key=lambda p: len(p.parts), reverse=True):
        if not d.is_dir():
            continue
        kill_all([str(d)])
        for child in sorted((c for c in d.iterdir() if c.is_dir()), reverse=True):
            remove([str(child)])
        for attempt in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY or attempt == 49:
                    raise LabCommandFailed(f"cannot remove cgroup {d}: {e.strerror}") from None
                time.sleep(0.05)


def find_lab_dirs(hier: Hierarchy, lab: str | None = None, max_depth: int = 4) -> list[Path]:
    """Every cgroup directory named like a lab's (`hppctl-lab-<lab>`, or any lab), at any parent."""
    wanted = cgroup_lab_dir_name(lab) if lab else None
    found = []
    for root in hier.unique_roots():
        stack = [(root, 0)]
        while stack:
            d, depth = stack.pop()
            try:
                children = [c for c in d.iterdir() if c.is_dir()]
            except OSError:
                continue
            for c in children:
                if (c.name == wanted) if wanted else c.name.startswith(CGROUP_PREFIX):
                    found.append(c)
                elif depth < max_depth:
                    stack.append((c, depth + 1))
    return sorted(found)


def membership(proc_cgroup_text: str) -> dict[str, str]:
    """controller -> cgroup path from /proc/PID/cgroup text ('' key for the v2 unified entry)."""
    out = {}
    for line in proc_cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                out[controller] = parts[2]
    return out


def relative(hier: Hierarchy, directory: str, controller: str) -> str:
    """The path /proc/PID/cgroup shows for a process in `directory` (relative to the hierarchy's root)."""
    return "/" + str(Path(directory).relative_to(hier.roots[controller]))
