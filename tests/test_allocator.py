"""hppctl/allocator.py: with a steady heap a freed activation-sized block is reused, not returned to
the kernel and faulted in again (which made per-layer times bimodal); the probe and the workers set it."""

import subprocess
import sys

import pytest

REFAULTS = r"""
import ctypes, resource, sys
if sys.argv[1] == "steady":
    from hppctl.allocator import steady_heap
    assert steady_heap() == "steady"
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 8 * 1024 * 1024  # one MobileNetV2 activation at batch 64
def touch():  # a layer's output and its input's gradient, freed together (the heap top then shrinks)
    blocks = [libc.malloc(size) for _ in range(3)]
    for p in blocks:
        ctypes.memset(p, 1, size)
    for p in blocks:
        libc.free(p)
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_after_warmup(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", REFAULTS, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_steady_heap_reuses_freed_blocks():
    pages = 8 * 1024 * 1024 // 4096
    assert faults_after_warmup("default") >= 5 * pages  # glibc's default: fresh pages on every reuse
    assert faults_after_warmup("steady") < pages


def test_opt_out(monkeypatch):
    from hppctl.allocator import steady_heap

    monkeypatch.setenv("HPPCTL_MALLOC", "default")
    assert steady_heap().startswith("default")


def test_probe_and_workers_set_it(monkeypatch, capsys):
    """The profile must be measured under the allocator the workers run with."""
    import io

    from hppctl.profiling import probe
    from hppctl.runtime import worker_entry
    from hppctl.runtime.config import WorkerConfig

    calls = []
    monkeypatch.setattr(probe, "steady_heap", lambda: calls.append("probe"))
    monkeypatch.setattr(worker_entry, "steady_heap", lambda: calls.append("worker"))
    assert probe.main(["sleep", "--args", '{"seconds": 0}']) == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("not json\n"))
    with pytest.raises(SystemExit):  # a bad config line: the heap is set before it is read
        worker_entry.worker_main(WorkerConfig, lambda config, token: 0)
    assert calls == ["probe", "worker"]
