"""How good is the planner's closed form (Eqs. 4-6, "dominant step")? Compare it with the simulator.

    python bench/estimate_vs_sim.py [--random 500] [--skip-matrix] [--json out.json]

error = (estimate - simulated) / simulated round latency: negative = the estimate is optimistic.

1. The `--compare` matrix of bench/table4.py (Table 6 environments x the four training models x
   micro-batch sizes, every strategy; preset profiles): every plan a strategy returns.
2. Random pipelines: synthetic profiles (2-10 devices, random speeds, links log-uniform in
   0.5-125 MB/s, i.e. 4 Mbit/s to 1 Gbit/s), random partitions into 1-6 stages with random groups and uneven allocations,
   M in 1..64, each of the three schedules (1f1b-asteroid, 1f1b, gpipe).
Both use the simulator's default model (async sends, pre-posted receives, shared uplinks, full
duplex links, ring AllReduce). Figures are recorded in docs/simulator.md.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hppctl import planner  # noqa: E402
from hppctl.models.plan import PlanRequest  # noqa: E402
from hppctl.planner.cost import StageChoice  # noqa: E402
from hppctl.planner.registry import Candidate  # noqa: E402
from hppctl.profiling.synthetic import synthetic_profile  # noqa: E402
from hppctl.schedule import simulate_plan  # noqa: E402


def matrix_rows() -> list[dict]:
    import table4  # the foundation issue's --compare matrix (ENVS x MODELS x MICRO)
    from hppctl import zoo
    from hppctl.models.cluster import ClusterSpec
    from hppctl.profiling.from_presets import build_preset_profile
    from hppctl.store import load

    rows = []
    for model, global_batch in table4.MODELS.items():
        layers = zoo.layer_costs(model, "fine")
        for env in table4.ENVS.values():
            cluster = load(ROOT / "profiles" / f"{env}.yaml", ClusterSpec)
            profile = build_preset_profile(cluster, layers, model=model, granularity="fine")
            for micro in table4.MICRO[global_batch]:
                request = PlanRequest(global_batch=global_batch, micro_batch=micro)
                for r in planner.compare(profile, request, simulate=lambda plan: simulate_plan(plan, profile)[1].round_latency_s):
                    if r.plan is None:
                        continue
                    rows.append(_row("matrix", r.plan, r.simulated_round_latency_s, model=model, env=env,
                                     strategy=r.strategy, feasible=r.feasible, case=f"{model} {env} B={micro}"))
                print(f"  {model} {env} B={micro}: {len(rows)} plans so far", file=sys.stderr)
    return rows


def random_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        num_devices = rng.randint(2, 10)
        num_layers = rng.randint(8, 60)
        profile = synthetic_profile(
            num_layers, [rng.choice([0.5, 1, 1, 2, 3, 5]) for _ in range(num_devices)],
            memory_bytes=[64 * 10**9] * num_devices, seed=rng.randrange(10**6),
            bandwidth_bytes_per_s=_log_uniform(rng, 0.5e6, 125e6), activation_scale=rng.choice([0.25, 1, 4]),
            param_scale=rng.choice([0.1, 1, 10]),
            links=[(f"dev{a}", f"dev{b}", _log_uniform(rng, 0.5e6, 125e6))
                   for a in range(num_devices) for b in range(a + 1, num_devices) if rng.random() < 0.3])
        micro = rng.choice([4, 8, 16, 32, 64])
        M = rng.choice([1, 2, 4, 8, 16, 32, 64])
        request = PlanRequest(global_batch=micro * M, micro_batch=micro)
        cm = planner.cost_model(profile, request)
        stages = _random_stages(rng, num_layers, num_devices, micro)
        for schedule in ("1f1b-asteroid", "1f1b", "gpipe"):
            plan = planner.to_plan(cm, profile, request, "random", Candidate(stages, schedule=schedule), 0.0)
            sim = simulate_plan(plan, profile)[1].round_latency_s
            rows.append(_row("random", plan, sim, strategy="random", feasible=True))
    return rows[:n]


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _random_stages(rng: random.Random, num_layers: int, num_devices: int, micro: int) -> list[StageChoice]:
    P = rng.randint(1, min(6, num_devices, num_layers))
    cuts = sorted(rng.sample(range(1, num_layers), P - 1))
    bounds = [0, *cuts, num_layers]
    devices = list(range(num_devices))
    rng.shuffle(devices)
    used = rng.randint(P, num_devices)
    sizes = [1] * P
    for _ in range(used - P):
        sizes[rng.randrange(P)] += 1
    stages, d = [], 0
    for p in range(P):
        group = tuple(devices[d:d + sizes[p]])
        d += sizes[p]
        weights = [rng.uniform(0.2, 1) for _ in group]
        samples = [int(micro * w / sum(weights)) for w in weights]
        samples[0] += micro - sum(samples)
        stages.append(StageChoice(bounds[p], bounds[p + 1], group, tuple(samples)))
    return stages


def _row(kind: str, plan, simulated: float, **extra) -> dict:
    est = plan.prediction.round_latency_s
    dominant = "transfer" if plan.prediction.dominant_step % 2 else "stage"
    return {"set": kind, "schedule": plan.schedule, "stages": len(plan.stages),
            "devices": sum(len(s.devices) for s in plan.stages), "M": plan.num_micro_batches,
            "estimate_s": est, "simulated_s": simulated, "error": (est - simulated) / simulated,
            "dominant": dominant, **extra}


def summary(rows: list[dict]) -> str:
    errs = sorted(r["error"] for r in rows)
    if not errs:
        return "| - |"
    n = len(errs)

    def q(x: float) -> float:
        return errs[min(n - 1, int(round(x * (n - 1))))]

    within = lambda t: sum(abs(e) <= t for e in errs) / n  # noqa: E731
    return (f"| {n} | {statistics.median(errs):+.1%} | {statistics.fmean(errs):+.1%} | {q(0.05):+.1%} | {q(0.95):+.1%} "
            f"| {errs[0]:+.1%} | {errs[-1]:+.1%} | {within(0.01):.0%} | {within(0.05):.0%} | {within(0.10):.0%} |")


HEADER = ("| group | plans | median | mean | p5 | p95 | min | max | within 1% | within 5% | within 10% |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def report(rows: list[dict]) -> None:
    print(HEADER)
    groups: list[tuple[str, list[dict]]] = []
    for kind in ("matrix", "random"):
        part = [r for r in rows if r["set"] == kind]
        if not part:
            continue
        groups.append((f"**{kind}: all**", part))
        if kind == "matrix":
            for strategy in ("asteroid", "asteroid-paper", "dp", "pp", "pipedream", "dapple"):
                groups.append((f"{kind}: {strategy}", [r for r in part if r["strategy"] == strategy]))
        for schedule in ("1f1b-asteroid", "1f1b", "gpipe"):
            groups.append((f"{kind}: schedule {schedule}", [r for r in part if r["schedule"] == schedule]))
        groups.append((f"{kind}: one stage", [r for r in part if r["stages"] == 1]))
        groups.append((f"{kind}: 2+ stages, dominant step a stage", [r for r in part if r["stages"] > 1 and r["dominant"] == "stage"]))
        groups.append((f"{kind}: 2+ stages, dominant step a transfer", [r for r in part if r["dominant"] == "transfer"]))
    for label, part in groups:
        if part:
            print(f"| {label} " + summary(part))


def rankings(rows: list[dict]) -> None:
    """Does ranking by the simulation change the answer `--compare` gives?"""
    cases: dict[str, list[dict]] = {}
    for r in rows:
        if r["set"] == "matrix" and r["feasible"]:
            cases.setdefault(r["case"], []).append(r)
    if not cases:
        return
    changed, asteroid_first, flips = 0, 0, []
    for case, part in cases.items():
        by_est = min(part, key=lambda r: r["estimate_s"])["strategy"]
        by_sim = min(part, key=lambda r: r["simulated_s"])
        best_sim = [r["strategy"] for r in part if r["simulated_s"] <= by_sim["simulated_s"] * (1 + 1e-9)]
        asteroid_first += "asteroid" in best_sim
        if by_est not in best_sim:
            changed += 1
            flips.append(f"{case}: {by_est} by estimate, {by_sim['strategy']} by simulation")
    print(f"\nranking ({len(cases)} model x environment x micro-batch cases with feasible plans): the fastest "
          f"strategy differs between estimate and simulation in {changed}; asteroid is (jointly) fastest by "
          f"simulation in {asteroid_first}")
    for line in flips[:10]:
        print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--random", type=int, default=600, help="random pipelines (a multiple of 3: one per schedule)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-matrix", action="store_true")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = [] if args.skip_matrix else matrix_rows()
    rows += random_rows(args.random, args.seed)
    print("error = (estimate - simulated) / simulated round latency; negative = the closed form is optimistic\n")
    report(rows)
    rankings(rows)
    worst = sorted(rows, key=lambda r: r["error"])[:3] + sorted(rows, key=lambda r: -r["error"])[:3]
    print("\nextremes:")
    for r in worst:
        where = f"{r.get('model', '')} {r.get('env', '')} {r['strategy']}".strip()
        print(f"  {r['error']:+.1%}  {where}: {r['stages']} stages on {r['devices']} devices, M = {r['M']}, "
              f"{r['schedule']}, dominant step a {r['dominant']}; estimate {r['estimate_s']:.3f} s, "
              f"simulated {r['simulated_s']:.3f} s")
    print(f"\n({time.perf_counter() - started:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
