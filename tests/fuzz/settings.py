"""Hypothesis settings of the fuzz suite: derandomized (the same examples on every run and in CI,
so a failure reproduces), no deadline (a slow example is not a failure; hangs are bounded by
harness.py), capped example counts. HPPCTL_FUZZ_SCALE=N multiplies the counts for a longer local
hunt; HPPCTL_FUZZ_SHRINK=1 lets Hypothesis minimise a failure (slow while many cases fail)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

SCALE = max(1, int(os.environ.get("HPPCTL_FUZZ_SCALE", "1")))
SHRINK = os.environ.get("HPPCTL_FUZZ_SHRINK") == "1"


def fuzz_settings(max_examples: int) -> settings:
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else [])
    return settings(max_examples=max_examples * SCALE, deadline=None, derandomize=True, database=None,
                    phases=phases, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture, HealthCheck.large_base_example])
