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
a second busy worker of their own kind would slow down or starve: they run one at a time in each of two streams
(SIDE_STREAM_DIRS), or alone."""

SIDE_STREAM_DIRS = frozenset({"lab", "docs"})
"""The `serial` tests marked `lab` or in these folders are also `side`: scripts/test.sh runs them one at a time
beside the other `serial` tests (also one at a time). A lab's hosts run under CPU quotas of 0.2-1 core, so the lab
tier alone leaves most of the machine idle; tests/docs (the README's everyday use as written, ~3 min) joins it so
that the two streams take about as long. Measured on the 2-core machine of 2026-11-27: with tests/recovery here
too, 752 s for the other stream and 802 s for this one, of which ~65 s were recovery's tests without a lab; then
test_interrupt lost ~65 s (the profile cache's passes are appended), so recovery went back to the other stream.
No lab test runs beside another (their labs would compete for subnets and for the machine's home directory, which
the hosts share). Tests that read CPU quotas or compare speeds under them are marked `alone` in their files and
run last, with nothing beside them."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not parallel_safe(item):
            item.add_marker(pytest.mark.serial)
            if side_stream(item):
                item.add_marker(pytest.mark.side)


def parallel_safe(item) -> bool:
    """Whether `item` may run beside another pytest worker (PARALLEL_SAFE_DIRS)."""
    if item.get_closest_marker("gloo") or item.get_closest_marker("lab") or item.get_closest_marker("alone"):
        return False
    return suite_folder(item) in PARALLEL_SAFE_DIRS


def side_stream(item) -> bool:
    """Whether `item`, a `serial` test, runs in the side stream (SIDE_STREAM_DIRS)."""
    return bool(item.get_closest_marker("lab")) or suite_folder(item) in SIDE_STREAM_DIRS


def suite_folder(item) -> str | None:
    """The folder of tests/ that holds `item`'s file (None for a file directly in tests/ or outside it)."""
    parts = item.path.relative_to(item.session.config.rootpath).parts
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else None
