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
    from tests.runtime.reference import torch_threads

    with torch_threads(1):
        yield


PARALLEL_SAFE_DIRS = frozenset({"bipartition", "cli", "coordinator", "fuzz", "galaxy", "models", "planner", "psl",
                                "schedule", "timeprest", "zoo"})
"""Test folders whose unmarked tests only compute (plans, schedules, files, the CLI's refusals): scripts/test.sh
runs them on two pytest-xdist workers. Every other test is `serial`: gloo and lab tests, and the folders whose
tests start workers, time heartbeats or probes, or read CPU quotas (runtime, recovery, profiling, lab, docs): they
run one at a time on each of two pytest-xdist workers (`--dist loadgroup`, groups from `serial_group`), or alone."""

LAB_GROUP = "lab"
"""The xdist group of every `lab` test: they all run on one worker, one after another, never two at once (their
labs would compete for subnets and for the machine's home directory, which the hosts share). A lab's hosts run
under CPU quotas of 0.2-1 core, so a lab test leaves most of the machine to the test on the other worker. Tests
that read CPU quotas or compare speeds under them are marked `alone` in their files and run last, with nothing
beside them."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups (else they are ignored)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not parallel_safe(item):
            item.add_marker(pytest.mark.serial)
            item.add_marker(pytest.mark.xdist_group(serial_group(item)))


def pytest_collection_finish(session):
    """Under `--dist loadgroup` pytest-xdist has read the groups (it appends each test's group to its id): when
    it had not (this conftest's hook ran after it), lab tests were spread over both workers silently, and one
    lab's teardown cut another's run."""
    if getattr(session.config.option, "loadgroup", False):
        ignored = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
        if ignored:
            raise pytest.UsageError(f"pytest-xdist ignored the xdist_group of {len(ignored)} tests, e.g. {ignored[0]}")


def parallel_safe(item) -> bool:
    """Whether `item` may run beside another pytest worker (PARALLEL_SAFE_DIRS)."""
    if item.get_closest_marker("gloo") or item.get_closest_marker("lab") or item.get_closest_marker("alone"):
        return False
    return suite_folder(item) in PARALLEL_SAFE_DIRS


def serial_group(item) -> str:
    """The xdist group of a `serial` test: LAB_GROUP for a lab test, else its file, so that a module's
    fixtures (plans, trained references) are made once, on the one worker that runs the module. (No test
    without the `lab` mark uses a lab: it would fail where there is no root.)"""
    if item.get_closest_marker("lab"):
        return LAB_GROUP
    return str(item.path.relative_to(item.session.config.rootpath))


def suite_folder(item) -> str | None:
    """The folder of tests/ that holds `item`'s file (None for a file directly in tests/ or outside it)."""
    parts = item.path.relative_to(item.session.config.rootpath).parts
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else None
