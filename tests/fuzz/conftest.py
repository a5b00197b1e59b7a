"""Each fuzz module runs with the gates installed (no workers, measurements or labs: gates.py) and
an address-space bound, so a mutation that asks for 10**30 of something fails instead of taking the
shared machine's memory. Module scope, not session: both are undone before any test outside
tests/fuzz runs in the same pytest session."""

from __future__ import annotations

import resource

import pytest

from tests.fuzz import gates
from tests.fuzz.harness import MEMORY_BOUND_BYTES


@pytest.fixture(scope="module", autouse=True)
def fuzz_gates():
    with gates.installed():
        yield


@pytest.fixture(scope="module", autouse=True)
def bounded_memory():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    bound = MEMORY_BOUND_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_BOUND_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (bound, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
