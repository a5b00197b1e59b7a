"""Tier 1 (pure): every Bi-Partition strategy against an exhaustive search over its own space, scored
by the round estimate it ranks plans by (issue 24 item 1; tests/bipartition/round_search.py).
`pytest tests/bipartition/test_round_optimal.py -s` prints the largest gaps;
`python bench/bipartition_optimality.py` prints the table recorded in docs/bipartition.md.
"""

from __future__ import annotations

import pytest

from tests.bipartition.round_search import GAP_BOUNDS, INSTANCES, MAY_MISS, compare

GAPS: dict[str, list[float]] = {}


@pytest.mark.parametrize("strategy", list(GAP_BOUNDS))
@pytest.mark.parametrize("seed", range(INSTANCES))
def test_strategy_round_against_exhaustive_search(seed, strategy):
    found, optimum = compare(seed, strategy)
    if optimum is None:
        assert found is None, "the strategy returned a plan outside the space or over a memory budget"
        return
    if found is None:
        assert strategy in MAY_MISS, "no plan found where the exhaustive search found one"
        return
    assert found >= optimum * (1 - 1e-9), "the exhaustive search is a lower bound over the same space"
    gap = found / optimum - 1
    GAPS.setdefault(strategy, []).append(gap)
    assert gap <= GAP_BOUNDS[strategy] + 1e-9, f"{strategy}: round {found:.6g} s, exhaustive optimum {optimum:.6g} s"


def test_report_largest_gaps():
    # Runs after the parametrised cases (file order).
    for strategy, gaps in GAPS.items():
        print(f"\n{strategy}: {len(gaps)} feasible instances, largest gap {max(gaps):.2%}, "
              f"optimal on {sum(g < 1e-9 for g in gaps)}")
