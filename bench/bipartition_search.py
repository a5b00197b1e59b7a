"""Bi-Partition's planner, measured: the paper's worked example, the binary search's gap, what the
interleaving restriction costs, equal cuts against the layer-wise planner, and planning time.

    python bench/bipartition_search.py                 # ~1 minute on 2 cores
    python bench/bipartition_search.py --instances 500

Random instances are tests/bipartition/test_planner.py's (L <= 5 layers, W <= 3 heterogeneous workers,
per-link bandwidth, tight memory, split traffic priced), small enough for exhaustive search.
Planning time: `make_plan(..., "bipartition")` on preset profiles (every device order and worker
count the strategy tries, the runtime's cost model).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hppctl.models.cluster import ClusterSpec  # noqa: E402
from hppctl.models.plan import PlanRequest  # noqa: E402
from hppctl.planner import make_plan  # noqa: E402
from hppctl.planner.bipartition import BiCosts, BiOptions  # noqa: E402
from hppctl.planner.bipartition_dp import exhaustive, solve  # noqa: E402
from hppctl.profiling.from_presets import build_preset_profile  # noqa: E402
from hppctl.zoo import layer_costs  # noqa: E402
from tests.bipartition.test_planner import paper_costs, random_costs  # noqa: E402

ENV_B = {"name": "envb", "bandwidth": "100mbit",
         "devices": [{"name": f"nx{i}", "preset": "jetson-nx"} for i in range(3)]
         + [{"name": f"tx{i}", "preset": "jetson-tx2"} for i in range(2)]}


def worked_example() -> None:
    print("paper's worked example (F = 1,3,2,3; B = 2,6,4,6; 3 workers), bottleneck per micro-batch:")
    cases = [("paper's model, separate cuts", BiOptions.paper()),
             ("paper's model, equal cuts (layer-wise)", BiOptions(recompute=False, split_traffic=False, equal_cuts=True)),
             ("runtime's model (split layers recomputed)", BiOptions())]
    for label, options in cases:
        r = solve(paper_costs(options))
        print(f"  {label:<44} {r.bottleneck_s:5.1f}   forward cuts {r.forward}, backward cuts {r.backward}")


def search_gaps(n: int, memory: bool = True) -> None:
    rng = np.random.default_rng(2026)
    bsa_gaps, bsa_missed, restricted, solved = [], 0, [], 0
    for _ in range(n):
        c = random_costs(rng, BiOptions())
        if not memory:
            c = dataclasses.replace(c, budget=np.full(c.W, np.inf))
        exact = solve(c)
        if exact is None:
            continue
        solved += 1
        bsa = solve(c, "bsa")
        if bsa is None:
            bsa_missed += 1
        else:
            bsa_gaps.append(bsa.bottleneck_s / exact.bottleneck_s - 1)
        restricted.append(exact.bottleneck_s / exhaustive(c, interleaved_only=False).bottleneck_s - 1)
    worse = [g for g in bsa_gaps if g > 1e-9]
    print(f"\nbinary search (Alg. 2) vs exact DP, {solved} feasible random instances, "
          f"{'tight memory budgets' if memory else 'no memory budgets'}:")
    print(f"  optimal on {len(bsa_gaps) - len(worse)}, worse on {len(worse)} (largest gap {max(bsa_gaps):.1%}, "
          f"median of those {np.median(worse) if worse else 0:.1%}), no feasible plan found on {bsa_missed}")
    bad = [g for g in restricted if g > 1e-9]
    print(f"interleaved DP (split layers between neighbours) vs the whole Eq. 1 space (exhaustive):")
    print(f"  equal on {len(restricted) - len(bad)}, worse on {len(bad)} (largest gap {max(restricted):.1%})")


def larger_instances(n: int) -> None:
    """BSA vs the exact DP where exhaustive search is out of reach: L in 8..20 layers, W in 2..5."""
    rng = np.random.default_rng(7)
    gaps, missed = [], 0
    for _ in range(n):
        L, W = int(rng.integers(8, 21)), int(rng.integers(2, 6))
        fwd = rng.uniform(0.1, 3, (1, L)) * rng.uniform(0.5, 2, (W, 1))
        boundary = np.zeros(L + 1)
        boundary[1:L] = rng.uniform(0, 5, L - 1)
        bandwidth = rng.uniform(1, 10, (W, W))
        bandwidth = (bandwidth + bandwidth.T) / 2
        np.fill_diagonal(bandwidth, np.inf)
        c = BiCosts(fwd, fwd * rng.uniform(1.5, 2.5, (W, L)), boundary, rng.uniform(0, 5, L), rng.uniform(0, 20, L),
                    bandwidth, np.full(W, np.inf), tuple(min(2 * (W - w) - 1, 8) for w in range(W)), 8)
        exact, bsa = solve(c), solve(c, "bsa")
        if bsa is None:
            missed += 1
        else:
            gaps.append(bsa.bottleneck_s / exact.bottleneck_s - 1)
    worse = [g for g in gaps if g > 1e-9]
    print(f"binary search vs exact DP, {n} larger instances (L 8-20, W 2-5, no memory budgets): optimal on "
          f"{len(gaps) - len(worse)}, worse on {len(worse)} (largest gap {max(gaps):.1%}, median of those "
          f"{np.median(worse) if worse else 0:.1%}), no plan on {missed}")


def planning_time() -> None:
    print("\nplanning time, make_plan(strategy=bipartition), presets of Env B (5 devices), 100 Mbit/s:")
    cluster = ClusterSpec.model_validate(ENV_B)
    for model, granularity in (("vgg-mini", "fine"), ("mobilenetv2", "block"), ("bert-small", "fine"),
                               ("resnet50", "block"), ("mobilenetv2", "fine"), ("efficientnet-b1", "fine")):
        profile = build_preset_profile(cluster, layer_costs(model, granularity), model=model, granularity=granularity)
        began = time.perf_counter()
        plan = make_plan(profile, PlanRequest(global_batch=256, micro_batch=32), "bipartition")
        print(f"  {model:<12} {granularity:<5} {len(profile.layers):4d} layers  {time.perf_counter() - began:6.2f} s  "
              f"({len(plan.stages)} workers)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=300)
    args = parser.parse_args()
    worked_example()
    search_gaps(args.instances)
    search_gaps(args.instances, memory=False)
    larger_instances(args.instances // 3)
    planning_time()


if __name__ == "__main__":
    main()
