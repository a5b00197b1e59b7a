"""What a device offers, read ON the device: CPU quota, thread count, memory budget, identity.

Standard library only (the probe imports it before torch). Runs on Linux devices; anything it
cannot read is reported as unknown rather than guessed.

CPU quota, in order:
1. the cgroup the probe runs in: v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`, the
   smallest along the path to the root (a parent's limit caps its children);
2. when the process sits in a non-root cgroup whose files are not visible (e.g. under
   `ip netns exec`, which remounts /sys, as in the edge lab), the measured duty cycle: `cpus` threads hash a buffer for a fraction of a second
   (hashlib releases the GIL), and CPU seconds / wall seconds is the number of cores the process
   actually gets. Below `cpus - 0.25` it is taken as a quota;
3. otherwise no quota: every CPU in the affinity mask.

Threads = ceil(quota), at most the CPUs in the affinity mask. Why: a CFS quota is a budget of
CPU time per period shared by all threads of the cgroup. More threads than the quota burn the
budget early in each period and then every thread stalls until the next one; intra-op parallel
regions wait for their slowest thread, so a stalled thread stalls the layer. One thread per
quota core (rounded up: 1.5 cores get 2 threads, since one would leave half a core unused) is
what the device can sustain (a measured quota up to 0.1 core over a whole number counts as that
number: the duty cycle reads a 1-core quota as up to 1.05). The same rule sets OMP_NUM_THREADS in
the edge lab's sessions.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import socket
import threading
import time
from pathlib import Path

UNLIMITED = None


# ---------------------------------------------------------------------------------------------
# cgroups
# ---------------------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """Controller ('cpu', 'memory', or '' for the v2 unified hierarchy) -> (mount root, mount point)."""
    mounts: dict[str, tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point, fstype, options = fields[3], fields[4], tail[0], tail[2]
        if fstype == "cgroup2":
            mounts.setdefault("", (root, point))
        elif fstype == "cgroup":
            for controller in options.split(","):
                if controller in ("cpu", "memory"):
                    mounts.setdefault(controller, (root, point))
    return mounts


def cgroup_paths(proc_cgroup: str) -> dict[str, str]:
    """Controller -> cgroup path from /proc/self/cgroup ('' is the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[""] = path
        for controller in controllers.split(","):
            if controller in ("cpu", "memory"):
                paths[controller] = path
    return paths


def _directories(mount: tuple[str, str], path: str) -> list[Path]:
    """The cgroup directory of `path` and its ancestors up to the mount, innermost first."""
    root, point = mount
    relative = path[len(root):] if root != "/" and path.startswith(root) else path
    parts = [p for p in relative.split("/") if p]
    return [Path(point, *parts[:i]) for i in range(len(parts), -1, -1)]


def _cpu_quota_v2(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if not text:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max":
        return None
    return int(quota) / int(period or 100000)


def _cpu_quota_v1(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0:
        return None
    return int(quota) / int(period)


def cgroup_limits(proc: Path = Path("/proc/self")) -> dict[str, object]:
    """{'cpu_quota_cores', 'memory_limit_bytes', 'cgroup'}; values None when unlimited or not visible."""
    mounts = cgroup_mounts(_read(proc / "mountinfo") or "")
    paths = cgroup_paths(_read(proc / "cgroup") or "")
    quota = memory = None
    version = None
    for controller, reader in (("cpu", _cpu_quota_v1), ("", _cpu_quota_v2)):
        if controller in mounts and controller in paths:
            version = version or ("v2" if controller == "" else "v1")
            values = [q for d in _directories(mounts[controller], paths[controller]) if (q := reader(d)) is not None]
            quota = min(values) if values else quota
    for controller, name in (("memory", "memory.limit_in_bytes"), ("", "memory.max")):
        if controller in mounts and controller in paths:
            version = version or ("v2" if controller == "" else "v1")
            values = []
            for d in _directories(mounts[controller], paths[controller]):
                text = _read(d / name)
                if text and text != "max" and int(text) < 2**60:  # v1 says "unlimited" as ~2^63
                    values.append(int(text))
            memory = min(values) if values else memory
    # A process in a non-root cgroup whose files are not visible here may still have a quota.
    hidden = version is None and any(paths.get(c, "/") not in ("/", "") for c in ("cpu", ""))
    return {"cpu_quota_cores": quota, "memory_limit_bytes": memory, "cgroup": version, "hidden": hidden}


# ---------------------------------------------------------------------------------------------
# measured duty cycle
# ---------------------------------------------------------------------------------------------


def duty_cycle(threads: int, seconds: float = 0.4, limited_s: float = 2.0) -> float:
    """Cores this process actually gets: CPU seconds / wall seconds with `threads` busy threads.

    hashlib releases the GIL on buffers over 2 KiB, so the threads really run in parallel. Over a
    window of W seconds a CFS quota can give up to one period's budget more than quota x W (the
    window may open on a fresh budget and close on the next): a 1-core quota reads up to
    1 + period / W. After `seconds` the window is stretched to `limited_s` when the cores look
    limited, so that the kernel's and docker's 100 ms periods read within 0.05 core per quota core
    (0.4 s read one core as 1.10-1.18 after an idle spell); an unlimited process stops at `seconds`.
    """
    buffer = b"\x5a" * (256 << 10)
    stop = threading.Event()

    def spin() -> None:
        h = hashlib.sha256()
        while not stop.is_set():
            h.update(buffer)

    def ratio() -> float:
        return (time.process_time() - cpu0) / (time.perf_counter() - wall0)

    workers = [threading.Thread(target=spin, daemon=True) for _ in range(threads)]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    if ratio() < threads - 0.25:
        time.sleep(max(0.0, limited_s - (time.perf_counter() - wall0)))
    stop.set()
    for w in workers:
        w.join()
    return ratio()


def affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_quota(cpus: int, limits: dict[str, object], measure: bool = True) -> tuple[float | None, str]:
    """(quota in cores or None for unlimited, where it came from)."""
    if limits.get("cpu_quota_cores") is not None:
        return float(limits["cpu_quota_cores"]), f"cgroup {limits['cgroup']}"
    if not measure or not limits.get("hidden"):
        return None, "none"
    got = duty_cycle(cpus)
    if got < cpus - 0.25:
        return round(got, 3), f"measured duty cycle ({cpus} busy threads)"
    return None, "none (duty cycle of all CPUs)"


def threads_for(quota: float | None, cpus: int) -> int:
    """ceil(quota) threads, at most the CPUs we may run on (module docstring: why)."""
    if quota is None:
        return max(1, cpus)
    # A measured duty cycle reads a 1-core quota as 0.95-1.05 (over its 2 s window, one period's budget
    # more or less is up to 0.05 core): 1.03 must still mean one thread, or the device's fingerprint
    # (which holds the threads) flips between runs and a rerun misses the cache (seen in the lab test).
    return max(1, min(cpus, math.ceil(quota - 0.1)))


# ---------------------------------------------------------------------------------------------
# memory and identity
# ---------------------------------------------------------------------------------------------


def meminfo(text: str | None = None) -> dict[str, int]:
    """/proc/meminfo in bytes (MemTotal, MemAvailable, ...)."""
    text = text if text is not None else (_read(Path("/proc/meminfo")) or "")
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return values


def cpu_model() -> str:
    text = _read(Path("/proc/cpuinfo")) or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware", "cpu model"):
            return value.strip()
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def accelerator_record(accelerator: str) -> dict[str, object]:
    """The cluster file's `accelerator:` resolved here (runtime/accelerator.py), with the GPU's name
    and memory. `cpu` does not import torch (identify stays quick)."""
    if accelerator == "cpu":
        return {"requested": "cpu", "type": "cpu", "name": None, "memory_bytes": None, "integrated": None}
    from hppctl.runtime.accelerator import describe, resolve

    return {"requested": accelerator, **describe(resolve(accelerator, device_name=socket.gethostname()))}


def identify(measure_quota: bool = True, threads: int | None = None, accelerator: str = "cpu") -> dict[str, object]:
    """Everything the orchestrator needs to fingerprint the device and size the measurement."""
    from hppctl import __version__

    limits = cgroup_limits()
    cpus = affinity_cpus()
    quota, quota_source = cpu_quota(cpus, limits, measure_quota)
    info = meminfo()
    memory_limit = limits["memory_limit_bytes"]
    return {
        "type": "identity",
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpus": cpus,
        "cpu_quota_cores": quota,
        "cpu_quota_source": quota_source,
        "threads": threads if threads is not None else threads_for(quota, cpus),
        "threads_source": "option" if threads is not None else "quota",
        "memory_total_bytes": info.get("MemTotal"),
        "memory_available_bytes": info.get("MemAvailable"),
        "memory_limit_bytes": memory_limit,
        "memory_limit_source": f"cgroup {limits['cgroup']}" if memory_limit is not None else "none",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "hppctl": __version__,
        "kernel": platform.release(),
        "accelerator": accelerator_record(accelerator),
    }


def memory_budget(identity: dict[str, object]) -> int:
    """The cgroup memory limit if one is set, else MemAvailable (what a new process may still use)."""
    limit = identity.get("memory_limit_bytes")
    if limit:
        return int(limit)  # type: ignore[arg-type]
    return int(identity.get("memory_available_bytes") or identity.get("memory_total_bytes") or 0)  # type: ignore[arg-type]


def rss_bytes() -> tuple[int, int]:
    """(current RSS, peak RSS since the last reset) of this process, from /proc/self/status."""
    text = _read(Path("/proc/self/status")) or ""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def release_free_memory() -> None:
    """Give freed heap pages back to the OS (glibc malloc_trim) so RSS tracks live memory."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
