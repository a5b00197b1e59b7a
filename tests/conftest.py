"""Shared factories: small readable profiles and a CLI runner that returns (code, stdout, stderr)."""

from __future__ import annotations

import pytest

from hppctl.cli import run
from hppctl.profiling.synthetic import synthetic_profile


def make_profile(layers: int = 6, speeds=(1.0, 2.0, 3.0), memory_gb=None, seed: int = 0, **kw):
    memory = [int(g * 10**9) for g in memory_gb] if memory_gb else None
    return synthetic_profile(layers, list(speeds), memory_bytes=memory, seed=seed, **kw)


@pytest.fixture
def cli(capsys):
    def invoke(*argv: str) -> tuple[int, str, str]:
        code = run([str(a) for a in argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return invoke


@pytest.fixture
def one_torch_thread():
    """Tiny models: one intra-op thread is as fast and does not collapse on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


PARALLEL_SAFE_DIRS = frozenset({"bipartition", "cli", "coordinator", "fuzz", "galaxy", "models", "planner", "psl",
                                "schedule", "timeprest", "zoo"})
"""Test folders whose unmarked tests only compute (plans, schedules, files, the CLI's refusals): scripts/test.sh
runs them on two pytest-xdist workers. Every other test is `serial`: gloo and lab tests, and the folders whose
tests start workers, time heartbeats or probes, or read CPU quotas (runtime, recovery, profiling, lab, docs), which
a second busy worker beside them would slow down or starve."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not parallel_safe(item):
            item.add_marker(pytest.mark.serial)


def parallel_safe(item) -> bool:
    """Whether `item` may run beside another pytest worker (PARALLEL_SAFE_DIRS)."""
    if item.get_closest_marker("gloo") or item.get_closest_marker("lab"):
        return False
    parts = item.path.relative_to(item.session.config.rootpath).parts
    return len(parts) > 2 and parts[0] == "tests" and parts[1] in PARALLEL_SAFE_DIRS
