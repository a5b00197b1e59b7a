"""Every Bi-Partition strategy against an exhaustive search scored by what it minimises (issue 24
item 1): the round estimate, or for `bipartition-paper` the paper's bottleneck T(U). The table
docs/bipartition.md and docs/planner.md record.

    python bench/bipartition_optimality.py                  # the test's 40 instances, ~10 s
    python bench/bipartition_optimality.py --instances 300  # more seeds, same generator

Instances and brute force: tests/bipartition/round_search.py (1–3 identical devices, 4–8 layers,
every interleaved (forward cuts, backward cuts) pair, memory budgets, the planner's `round_estimate` or bottleneck).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.bipartition.round_search import GAP_BOUNDS, INSTANCES, compare  # noqa: E402


def table(instances: int) -> None:
    print(f"each strategy's objective vs exhaustive search, seeds 0..{instances - 1} "
          "(tests/bipartition/round_search.py; round estimate, bipartition-paper: bottleneck):")
    print(f"  {'strategy':<18} {'feasible':>8} {'optimal':>8} {'worst gap':>10} {'no plan found':>14}")
    for strategy in GAP_BOUNDS:
        gaps, missed = [], 0
        for seed in range(instances):
            found, optimum = compare(seed, strategy)
            if optimum is None:
                continue
            if found is None:
                missed += 1
                continue
            gaps.append(found / optimum - 1)
        feasible = len(gaps) + missed
        worst = f"{max(gaps):.2%}" if gaps else "-"
        print(f"  {strategy:<18} {feasible:>8} {sum(g < 1e-9 for g in gaps):>8} {worst:>10} {missed:>14}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=INSTANCES)
    table(parser.parse_args().instances)


if __name__ == "__main__":
    main()
