"""Every PSL method against an exhaustive search, as the runtime runs plans (issue 24 item 4).

    python bench/psl_exhaustive.py                      # ~3 minutes on 2 cores; figures in docs/psl.md
    python bench/psl_exhaustive.py --instances 10 --clients 4
    python bench/psl_exhaustive.py --search-only        # the search alone on 6-8 clients (seconds)

Instances: tests/psl/factories.py's `heterogeneous_times` (2 helpers; random client, helper and
per-pair link speeds, so all six times differ per helper; every third seed binds helper memory),
seeds 0 .. N-1 for each client count. Optimum: tests/psl/brute.py's `nonpreemptive_optimum` (every
memory-feasible assignment x every order of each helper's whole tasks). Every plan is scored by
`run_makespan`: whole tasks in the order the plan completes them, unrounded times — how
`hppctl psl run` executes it. gap = plan / optimum - 1. admm and exact solve on the default slot
grid (T_f ~ 100 slots), exact with the default 60 s limit. Last, the search alone (no incumbent,
auto's node budget) on larger instances: whether it finishes, its nodes and its time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hppctl.errors import Infeasible  # noqa: E402
from hppctl.planner.psl import plan_times  # noqa: E402
from hppctl.planner.psl.instance import Instance  # noqa: E402
from hppctl.planner.psl.search import MAX_NODES, search  # noqa: E402
from tests.psl.brute import nonpreemptive_optimum, run_makespan  # noqa: E402
from tests.psl.factories import heterogeneous_times, request_for  # noqa: E402

METHODS = ("random-fcfs", "balanced-greedy", "admm", "exact", "auto")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=30, help="seeds per client count")
    parser.add_argument("--clients", type=int, nargs="+", default=[4, 5])
    parser.add_argument("--search-only", action="store_true", help="only the search-alone section")
    args = parser.parse_args()
    if not args.search_only:
        compare_methods(args)
    search_alone()


def search_alone() -> None:
    print(f"\n# the search alone (no incumbent), budget {MAX_NODES} nodes")
    print("  J  I seed  complete    nodes  seconds")
    for clients, helpers in ((6, 2), (7, 2), (8, 2), (6, 3), (8, 3)):
        for seed in range(3):
            started = time.perf_counter()
            result = search(Instance.from_times(heterogeneous_times(seed, clients, helpers)))
            print(f"{clients:>3} {helpers:>2} {seed:>4} {str(result.complete):>9} {result.nodes:>8} "
                  f"{time.perf_counter() - started:>8.2f}", flush=True)


def compare_methods(args) -> None:
    gaps: dict[str, list[float]] = {m: [] for m in METHODS}
    failed = {m: 0 for m in METHODS}
    slowest = {m: 0.0 for m in METHODS}
    print(f"# bench/psl_exhaustive.py — {args.instances} seeds x clients {args.clients}, 2 helpers; gap to the "
          f"exhaustive non-preemptive optimum, plans as run")
    print("  J seed   optimum " + " ".join(f"{m:>16}" for m in METHODS) + "  auto chose")
    for clients in args.clients:
        for seed in range(args.instances):
            times = heterogeneous_times(seed, clients, helpers=2)
            optimum = nonpreemptive_optimum(Instance.from_times(times))
            if optimum == float("inf"):
                print(f"{clients:>3} {seed:>4}   no memory-feasible assignment")
                continue
            cells, chose = [], ""
            for method in METHODS:
                started = time.perf_counter()
                try:
                    plan = plan_times(times, request_for(times), method)
                except Infeasible:
                    failed[method] += 1
                    cells.append(f"{'infeasible':>16}")
                    continue
                slowest[method] = max(slowest[method], time.perf_counter() - started)
                gap = run_makespan(plan) / optimum - 1
                gaps[method].append(gap)
                cells.append(f"{gap:>16.1%}")
                chose = plan.method if method == "auto" else chose
            print(f"{clients:>3} {seed:>4} {optimum:>9.3f} " + " ".join(cells) + f"  {chose}", flush=True)
    print("\nmethod            instances  worst gap  mean gap  optimal  no plan  slowest s")
    for m in METHODS:
        g = gaps[m]
        optimal = sum(x <= 1e-9 for x in g)
        print(f"{m:<17} {len(g) + failed[m]:>9} {max(g):>10.1%} {sum(g) / len(g):>9.1%} {optimal:>8} "
              f"{failed[m]:>8} {slowest[m]:>10.2f}")


if __name__ == "__main__":
    main()
