"""Every Bi-Partition strategy against an exhaustive search scored by what it minimises (issue 24
item 1): the round estimate, or for `bipartition-paper` the paper's bottleneck T(U). The table
docs/bipartition.md and docs/planner.md record.

    python bench/bipartition_optimality.py                  # the test's 40 instances, ~10 s
    python bench/bipartition_optimality.py --instances 300  # more seeds, same generator
    python bench/bipartition_optimality.py --timing         # planning time on the largest built-ins
    python bench/bipartition_optimality.py --simulate       # round-optimal vs least-bottleneck plans, simulated

Instances and brute force: tests/bipartition/round_search.py (1–3 identical devices, 4–8 layers,
every interleaved (forward cuts, backward cuts) pair, memory budgets, the planner's `round_estimate` or bottleneck).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hppctl.models.cluster import ClusterSpec  # noqa: E402
from hppctl.models.plan import PlanRequest  # noqa: E402
from hppctl.planner import cost_model, make_plan  # noqa: E402
from hppctl.planner.bipartition import BiOptions, costs_from_model, round_estimate  # noqa: E402
from hppctl.planner.bipartition_dp import solve  # noqa: E402
from hppctl.planner.strategies.bipartition import build_plan  # noqa: E402
from hppctl.schedule import simulate_plan  # noqa: E402
from hppctl.profiling.from_presets import build_preset_profile  # noqa: E402
from hppctl.store import load  # noqa: E402
from hppctl.zoo import layer_costs  # noqa: E402
from tests.bipartition.round_search import GAP_BOUNDS, INSTANCES, compare, instance, paper_round_gap, \
    strategy_plan  # noqa: E402

STRATEGIES = ("bipartition", "bipartition-bsa", "bipartition-paper", "layerwise")
TIMED = (("efficientnet-b1", "fine", "env-c", 32), ("mobilenetv2", "fine", "env-c", 32),
         ("bert-large", "fine", "env-c", 2), ("mobilenetv2", "block", "env-b", 32))
"""(model, granularity, cluster, micro-batch) at global batch 256: bert-large fits the Jetsons at 2 only."""


def table(instances: int) -> None:
    print(f"each strategy's objective vs exhaustive search, seeds 0..{instances - 1} (tests/bipartition/"
          "round_search.py; round estimate; bipartition-paper: bottleneck, its plan's W and kind of cuts):")
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
    paper = [g for seed in range(instances) if (g := paper_round_gap(seed)) is not None]
    print(f"bipartition-paper's round estimate (paper's model) vs the least over all worker counts: "
          f"worst gap {max(paper):.2%}, optimal on {sum(g < 1e-9 for g in paper)} of {len(paper)}")


def timing() -> None:
    """Seconds of `make_plan` (the strategy alone: every device order and worker count it tries)."""
    print("planning time, make_plan, preset profiles of profiles/env-*.yaml, global batch 256:")
    print(f"  {'model':<16} {'gran.':<6} {'env':<6} {'B':>3} {'layers':>6}  " + "  ".join(f"{s:>17}" for s in STRATEGIES))
    for model, granularity, env, micro_batch in TIMED:
        cluster = load(ROOT / "profiles" / f"{env}.yaml", ClusterSpec)
        profile = build_preset_profile(cluster, layer_costs(model, granularity), model=model, granularity=granularity)
        cells = []
        for strategy in STRATEGIES:
            began = time.perf_counter()
            plan = make_plan(profile, PlanRequest(global_batch=256, micro_batch=micro_batch), strategy)
            cells.append(f"{time.perf_counter() - began:6.2f} s ({len(plan.stages)} w)")
        print(f"  {model:<16} {granularity:<6} {env:<6} {micro_batch:>3} {len(profile.layers):>6}  "
              + "  ".join(f"{c:>17}" for c in cells))


def least_bottleneck_plan(profile, request):
    """What `bipartition` planned before the round DP, on identical devices (order does not matter):
    per W the least-bottleneck cuts and the least-bottleneck equal cuts, the shorter round kept."""
    cm = cost_model(profile, request)
    best = None
    for W in range(1, len(cm.names) + 1):
        costs = costs_from_model(cm, list(range(W)), BiOptions())
        for result in (solve(costs), solve(costs.with_options(BiOptions(equal_cuts=True)))):
            if result is not None and (best is None or round_estimate(costs, result)[0] < best[0] * (1 - 1e-12)):
                best = (round_estimate(costs, result)[0], W, result)
    return None if best is None else build_plan(cm, list(range(best[1])), best[2], request, "least-bottleneck", 0.0)


def simulated(instances: int) -> None:
    """Does the simulator agree that the round-optimal plan is faster than the least-bottleneck one?"""
    print(f"bipartition (round-optimal) vs least-bottleneck plans, seeds 0..{instances - 1}, where they differ "
          "(round seconds; simulated = hppctl simulate's replay):")
    faster = slower = 0
    for seed in range(instances):
        profile, request = instance(seed)
        new, old = strategy_plan(profile, request, "bipartition"), least_bottleneck_plan(profile, request)
        if new is None or abs(new.prediction.round_latency_s / old.prediction.round_latency_s - 1) < 1e-9:
            continue
        sim_new, sim_old = (simulate_plan(p, profile)[1].round_latency_s for p in (new, old))
        faster, slower = faster + (sim_new < sim_old), slower + (sim_new > sim_old)
        print(f"  seed {seed:3d}: estimate {old.prediction.round_latency_s:.4g} -> {new.prediction.round_latency_s:.4g}"
              f" ({new.prediction.round_latency_s / old.prediction.round_latency_s - 1:+.1%}), simulated "
              f"{sim_old:.4g} -> {sim_new:.4g} ({sim_new / sim_old - 1:+.1%}), samples/s simulated "
              f"{request.global_batch / sim_old:.0f} -> {request.global_batch / sim_new:.0f}")
    print(f"  the simulator finds the round-optimal plan faster on {faster}, slower on {slower}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=INSTANCES)
    parser.add_argument("--timing", action="store_true", help="planning time instead of the optimality table")
    parser.add_argument("--simulate", action="store_true", help="simulate round-optimal vs least-bottleneck plans")
    args = parser.parse_args()
    if args.timing:
        timing()
    elif args.simulate:
        simulated(args.instances)
    else:
        table(args.instances)


if __name__ == "__main__":
    main()
