"""Lab fixtures: one real lab per test module (building one takes ~2 s), skipped with the reason
when this machine cannot build it (not root, a tool missing, no cpu/memory cgroup controllers)."""

from __future__ import annotations

import pytest

from hppctl.errors import BadInput


def lab_unavailable_reason() -> str | None:
    """None when a lab can be built here, else why not (the skip reason)."""
    from hppctl.lab import cgroups, system

    try:
        system.require("the lab tests", system.BASE_TOOLS + (system.DELAY_LINE_TOOL,))
        cgroups.detect()
    except BadInput as e:
        return str(e)
    return None


@pytest.fixture(scope="session")
def lab_reason():
    return lab_unavailable_reason()


@pytest.fixture(autouse=True)
def _skip_lab_tests_without_root(request, lab_reason):
    if request.node.get_closest_marker("lab") and lab_reason:
        pytest.skip(f"lab tests need root, tools and cgroups: {lab_reason}")


def free_subnet() -> str:
    """A lab subnet no other lab on this machine uses right now (benchmarks may run beside the suite)."""
    from hppctl.lab import network

    return network.free_subnet()
