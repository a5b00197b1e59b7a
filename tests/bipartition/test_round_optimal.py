"""Tier 1 (pure): every Bi-Partition strategy against an exhaustive search over its own space, scored
by what it minimises: the round estimate its plans report, or for `bipartition-paper` the paper's
bottleneck T(U) (issue 24 item 1; tests/bipartition/round_search.py).
`pytest tests/bipartition/test_round_optimal.py -s` prints the largest gaps;
`python bench/bipartition_optimality.py` prints the table recorded in docs/bipartition.md.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from hppctl.planner.bipartition import BiCosts, evaluate, interleaved, round_estimate, valid_cuts
from hppctl.planner.bipartition_dp import solve_round
from tests.bipartition.round_search import GAP_BOUNDS, INSTANCES, MAY_MISS, compare, cut_sequences
from tests.bipartition.test_planner import OPTION_SETS, random_costs

GAPS: dict[str, list[float]] = {}


@pytest.mark.parametrize("strategy", list(GAP_BOUNDS))
@pytest.mark.parametrize("seed", range(INSTANCES))
def test_strategy_objective_against_exhaustive_search(seed, strategy):
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


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_round_dp_equals_exhaustive_search_of_the_round_estimate(name):
    # The DP alone, on heterogeneous workers and links (tests/bipartition/test_planner.py's
    # instances), every option set, and M from 1 (no pipelining: 0 * inf must not be NaN) to 16.
    rng = np.random.default_rng(17)
    solved = 0
    for k in range(60):
        c = dataclasses.replace(random_costs(rng, OPTION_SETS[name]), num_micro_batches=[1, 2, 4, 16][k % 4])
        dp, brute = solve_round(c), exhaustive_round(c)
        assert (dp is None) == (brute is None)
        if dp is None:
            continue
        solved += 1
        assert dp.feasible and round_estimate(c, dp)[0] == pytest.approx(brute, rel=1e-12)
    assert solved >= 20


def exhaustive_round(c: BiCosts) -> float | None:
    """The least round estimate over every cut pair in the options' space (the options' own memory)."""
    seqs = cut_sequences(c.L, c.W)
    rounds = [round_estimate(c, result)[0] for forward, backward in itertools.product(seqs, repeat=2)
              if valid_cuts(forward, backward, c.L)
              and (not c.options.interleaved_only or interleaved(forward, backward))
              and (not c.options.equal_cuts or forward == backward)
              and (result := evaluate(c, forward, backward)).feasible]
    return min(rounds, default=None)
