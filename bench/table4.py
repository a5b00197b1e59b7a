"""The acceptance matrix: Asteroid's Table 4 environments x models, every strategy side by side.

    python bench/table4.py [--granularity fine|block] [--json out.json] [--micro-batch auto]

For each environment of Table 6 (A, B, B at 1000 Mbps, C, D) and each training model
(mobilenetv2, efficientnet-b1, resnet50, bert-small) at the paper's global batch (2048;
256 for resnet50) it builds a preset profile, runs `--compare` for several micro-batch sizes
and keeps, per strategy, the best feasible micro-batch (the paper does not state B); with
`--micro-batch auto` each strategy chooses its own from every divisor of the global batch the profile
covers (`hppctl plan --micro-batch auto`, docs/planner.md "Choosing the micro-batch"). It prints
throughput per strategy, Asteroid's speedup over Device / DP / PP next to the paper's Table 4,
and the shape of Asteroid's plan. Figures are recorded in docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hppctl import planner, zoo  # noqa: E402
from hppctl.models.cluster import ClusterSpec  # noqa: E402
from hppctl.models.plan import PlanRequest  # noqa: E402
from hppctl.planner.cost import StageChoice  # noqa: E402
from hppctl.planner.allocation import allocate  # noqa: E402
from hppctl.profiling.from_presets import build_preset_profile  # noqa: E402
from hppctl.store import load  # noqa: E402

ENVS = {"A (100 Mbps)": "env-a", "B (100 Mbps)": "env-b", "B (1000 Mbps)": "env-b-1000", "C (100 Mbps)": "env-c",
        "D (100 Mbps)": "env-d"}
MODELS = {"efficientnet-b1": 2048, "mobilenetv2": 2048, "resnet50": 256, "bert-small": 2048}
MICRO = {2048: (16, 32, 64, 128), 256: (8, 16, 32, 64)}
# Paper Table 4: speedup over (Device, DP, PP); Envs C and D are not in Table 4.
PAPER = {
    ("efficientnet-b1", "env-a"): (4.4, 2.1, 2.8), ("efficientnet-b1", "env-b"): (3.0, 4.8, 9.7),
    ("efficientnet-b1", "env-b-1000"): (3.7, 2.1, 1.4),
    ("mobilenetv2", "env-a"): (4.5, 1.5, 3.5), ("mobilenetv2", "env-b"): (3.2, 2.3, 11.2),
    ("mobilenetv2", "env-b-1000"): (3.8, 1.2, 1.3),
    ("resnet50", "env-a"): (3.4, 3.6, 5.8), ("resnet50", "env-b"): (1.5, 6.1, 12.2),
    ("resnet50", "env-b-1000"): (3.7, 2.9, 3.1),
    ("bert-small", "env-a"): (3.5, 6.4, 1.0), ("bert-small", "env-b"): (1.3, 6.8, 1.0),
    ("bert-small", "env-b-1000"): (3.9, 4.2, 1.3),
}


def device_baseline(profile, request) -> float:
    """On-device training on the single fastest device (the paper's 'Device' column), samples/s."""
    cm = planner.cost_model(profile, request)
    best = 0.0
    for d in range(len(cm.names)):
        if allocate(cm, [d], 0, cm.num_layers, 1) is None:
            continue
        latency = cm.evaluate([StageChoice(0, cm.num_layers, (d,), (cm.B,))]).round_latency_s
        best = max(best, request.global_batch / latency)
    return best


def shape(plan) -> str:
    """e.g. '[0,41) nx0+tx0 | [41,158) tx1'."""
    return " | ".join(f"[{s.start},{s.end}) {'+'.join(s.devices)}" for s in plan.stages)


def best_of_grid(profile, global_batch: int) -> tuple[dict, float]:
    """Per strategy, its best feasible row over the fixed micro-batches MICRO; and the Device baseline."""
    best: dict[str, object] = {}
    device = 0.0
    for micro in MICRO[global_batch]:
        request = PlanRequest(global_batch=global_batch, micro_batch=micro)
        device = max(device, device_baseline(profile, request))
        for row in planner.compare(profile, request):
            current = best.get(row.strategy)
            if row.feasible and (current is None or row.throughput > current.throughput):
                best[row.strategy] = row
    return best, device


def best_auto(profile, global_batch: int) -> tuple[dict, float]:
    """Per strategy, the row `--micro-batch auto` chooses; the Device baseline over the same candidates
    that one device's profile covers."""
    from hppctl.planner.micro_batch import candidate_micro_batches, compare_auto

    best = {row.strategy: row for row in compare_auto(profile, global_batch) if row.feasible}
    covered = min(max(d.batch_sizes) for d in profile.devices)
    device = max(device_baseline(profile, PlanRequest(global_batch=global_batch, micro_batch=b))
                 for b in candidate_micro_batches(profile, global_batch) if b <= covered)
    return best, device


def run(granularity: str, auto: bool = False) -> list[dict]:
    results = []
    for model, global_batch in MODELS.items():
        layers = zoo.layer_costs(model, granularity)
        for env_label, env in ENVS.items():
            cluster = load(ROOT / "profiles" / f"{env}.yaml", ClusterSpec)
            profile = build_preset_profile(cluster, layers, model=model, granularity=granularity)
            best, device = best_auto(profile, global_batch) if auto else best_of_grid(profile, global_batch)
            results.append({"model": model, "env": env, "env_label": env_label, "device": device, "best": best})
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--granularity", default="fine")
    parser.add_argument("--json")
    parser.add_argument("--micro-batch", choices=("grid", "auto"), default="grid",
                        help="grid: the best of MICRO per strategy (default); auto: each strategy's own choice")
    args = parser.parse_args()
    started = time.perf_counter()
    results = run(args.granularity, auto=args.micro_batch == "auto")
    names = ["asteroid", "asteroid-paper", "dp", "pp", "pipedream", "dapple"]
    print(f"granularity {args.granularity}; throughput in samples/s (best micro-batch per strategy); "
          f"x = infeasible (memory)\n")
    print(f"{'model':<16}{'env':<15}" + "".join(f"{n:>15}" for n in names) + f"{'ok':>4}")
    for r in results:
        cells = []
        for n in names:
            row = r["best"].get(n)
            cells.append(f"{row.throughput:>15.1f}" if row else f"{'x':>15}")
        ast = r["best"].get("asteroid")
        ok = ast and all(ast.throughput >= row.throughput * (1 - 1e-9) for row in r["best"].values())
        print(f"{r['model']:<16}{r['env_label']:<15}" + "".join(cells) + f"{'yes' if ok else 'NO':>4}")
    print("\nAsteroid speedup over Device / DP / PP: ours vs paper Table 4; plan of `asteroid` (micro-batch)")
    for r in results:
        ast = r["best"].get("asteroid")
        if not ast:
            continue
        ours = [ast.throughput / r["device"] if r["device"] else float("nan")]
        for base in ("dp", "pp"):
            row = r["best"].get(base)
            ours.append(ast.throughput / row.throughput if row else float("inf"))
        paper = PAPER.get((r["model"], r["env"]))
        paper_text = " / ".join(f"{x:.1f}" for x in paper) if paper else "   (not in Table 4)"
        print(f"{r['model']:<16}{r['env_label']:<15} ours {' / '.join(f'{x:.1f}' for x in ours):<18} "
              f"paper {paper_text:<18} B={ast.plan.micro_batch:<4} {shape(ast.plan)}")
    print(f"\n({time.perf_counter() - started:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps([
            {"model": r["model"], "env": r["env"], "device_throughput": r["device"],
             "strategies": {n: row.as_json() for n, row in r["best"].items()}} for r in results], indent=1))


if __name__ == "__main__":
    main()
